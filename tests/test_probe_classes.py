"""Classes of bad input found by an independent probe, each checked over every registered
component (not one example): Unicode digits in option text, finite floats too large for a
float32 step, list options spelled as text in a server request, an unbounded filter chain."""

from __future__ import annotations

import dataclasses
import json
import typing

import pytest

from dllm_decode.config import MAX_FILTERS, DecodeConfig
from dllm_decode.fields import FLOAT_MOST
from dllm_decode.registry import component, registry
from dllm_decode.serve.options import OptionError, check_options

KINDS = ("scheduler", "cache", "filter")


def _fields(want):
    """(kind, name, field) for every registered component field whose annotation `want` accepts."""
    out = []
    for kind in KINDS:
        for name, cls in registry(kind).items():
            hints = typing.get_type_hints(cls)
            out += [(kind, name, f.name) for f in dataclasses.fields(cls) if f.init and want(hints[f.name])]
    return out


def _plain(annotation):
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return args[0] if len(args) == 1 and typing.get_origin(annotation) is not tuple else annotation


INT_FIELDS = _fields(lambda a: _plain(a) is int)
FLOAT_FIELDS = _fields(lambda a: _plain(a) is float)
TUPLE_FIELDS = _fields(lambda a: typing.get_origin(a) is tuple)


def test_the_classes_are_populated():
    assert len(INT_FIELDS) > 40 and len(FLOAT_FIELDS) > 40 and TUPLE_FIELDS


@pytest.mark.parametrize("digits", ["\uff11\uff12", "\u0661\u0662", "\u0967"])   # fullwidth, Arabic-Indic, Devanagari
def test_option_text_in_non_ascii_digits_is_refused_for_every_int_field(digits):
    """int("\\uff11\\uff12") is 12 in Python; an option's text is a number only in ASCII digits."""
    accepted = []
    for kind, name, field in INT_FIELDS:
        try:
            component(kind, {"name": name, field: digits})
        except (ValueError, TypeError) as err:
            assert "\n" not in str(err)
        else:
            accepted.append(f"{kind} {name}.{field}")
    assert not accepted, accepted


def test_a_float_too_large_for_a_float32_step_is_refused_for_every_float_field():
    accepted = []
    for kind, name, field in FLOAT_FIELDS:
        for value in (1e39, -1e300, FLOAT_MOST * 10):
            try:
                component(kind, {"name": name, field: value})
            except ValueError as err:
                assert "\n" not in str(err)
            else:
                accepted.append(f"{kind} {name}.{field}={value:g}")
    assert not accepted, accepted


def test_pc_sampler_clip_past_float32_is_one_line_at_construction_not_a_failed_decode():
    with pytest.raises(ValueError, match="clip"):
        component("scheduler", {"name": "pc_sampler", "clip": 1e39})
    assert component("scheduler", {"name": "pc_sampler", "clip": 1e12}).clip == 1e12


@pytest.mark.parametrize("value", ["12", "\u0661\u0662", [True], ["1"], [1.5], {"a": 1}, 7])
def test_a_request_spells_a_list_option_only_as_a_json_list_of_its_items(value):
    """A server request's option values are typed JSON: text is the CLI's spelling of a list."""
    for kind, name, field in TUPLE_FIELDS:
        spec = {"name": name, field: value}
        with pytest.raises(OptionError) as err:
            check_options((kind,), spec, [], f"dllm.{kind}")
        assert field in str(err.value) and "\n" not in str(err.value)


def test_a_request_list_option_of_the_right_items_passes():
    for kind, name, field in TUPLE_FIELDS:
        inner = typing.get_args(typing.get_type_hints(registry(kind)[name])[field])[0]
        good = {int: [1, 2], float: [0.5], str: ["a"], bool: [True]}.get(inner, [[1, 2]])
        if good is not None:
            check_options((kind,), {"name": name, field: good}, [], f"dllm.{kind}")


def test_the_filter_chain_is_bounded():
    eotp = component("filter", "eotp")
    threshold = component("scheduler", "threshold")
    DecodeConfig(threshold, filters=(eotp,) * MAX_FILTERS, gen_length=16, block_length=8)
    with pytest.raises(ValueError, match="filters may hold at most"):
        DecodeConfig(threshold, filters=(eotp,) * (MAX_FILTERS * 300), gen_length=16, block_length=8)


# --- batch outputs: resume keys on how the model was loaded; a file that is not ours is kept ---

def _batch(tmp_path, *extra):
    from click.testing import CliRunner

    from dllm_decode.cli import main

    requests = tmp_path / "in.jsonl"
    requests.write_text(json.dumps({"id": "a", "prompt": "sort : mia ella hank", "max_tokens": 8}) + "\n")
    return CliRunner().invoke(main, ["--input", str(requests), "--output", str(tmp_path / "out.jsonl"),
                                     "--gen-length", "8", "--block-length", "8", *extra])


@pytest.mark.parametrize("changed, named", [(("--quantize", "int8"), "quantize"),
                                            (("--no-chat-template",), "chat_template"),
                                            (("--dtype", "bfloat16"), "dtype")])
def test_resume_after_changing_how_the_model_loads_is_refused(tmp_path, changed, named):
    assert _batch(tmp_path).exit_code == 0
    before = (tmp_path / "out.jsonl").read_text()
    (tmp_path / "in.jsonl").write_text((tmp_path / "in.jsonl").read_text()
                                       + json.dumps({"id": "b", "prompt": "sort : ella mia", "max_tokens": 8}) + "\n")
    result = _batch(tmp_path, *changed)
    assert result.exit_code == 2 and named in result.output and "Traceback" not in result.output
    assert (tmp_path / "out.jsonl").read_text() == before


@pytest.mark.parametrize("foreign", [b"precious\n", b"precious", b"[1, 2]\n", b'{"id": "x"}\nnot json\n'])
def test_an_output_that_is_not_a_results_file_is_refused_and_kept(tmp_path, foreign):
    """Only an unterminated record (a torn append) is cut: another file's text never is."""
    (tmp_path / "out.jsonl").write_bytes(foreign)
    result = _batch(tmp_path)
    assert (tmp_path / "out.jsonl").read_bytes()[:len(foreign)] == foreign
    if foreign != b"[1, 2]\n":               # valid JSON lines: kept, the result appended after
        assert result.exit_code == 2 and "not valid JSON" in result.output


def test_a_torn_last_record_is_still_cut(tmp_path):
    from dllm_decode.eval.harness.records import read_records, repair

    out = tmp_path / "out.jsonl"
    out.write_bytes(b'{"id": "a"}\n{"id": "b", "te')
    assert read_records(out) == [{"id": "a"}] and repair(out) > 0
    assert out.read_bytes() == b'{"id": "a"}\n'


# --- the command line: numbers in ASCII digits, for every numeric option of every command ---

def _numeric_options():
    import click

    from dllm_decode.cli import main

    ctx = click.Context(main)
    out = []
    for command in [main, *main.commands.values()]:
        for param in command.params:
            if isinstance(param, click.Option) and isinstance(param.type, click.types._NumberParamTypeBase):
                out.append((command, param))
    assert len(out) > 30
    return ctx, out


def test_every_numeric_cli_option_refuses_non_ascii_digits():
    import click

    ctx, options = _numeric_options()
    for command, param in options:
        for text in ("\uff13\uff12", "\u0660.\u0665", "\u0967"):
            with pytest.raises(click.BadParameter, match="ASCII digits"):
                param.type.convert(text, param, ctx)


def test_gen_length_in_fullwidth_digits_is_exit_2(tmp_path):
    from click.testing import CliRunner

    from dllm_decode.cli import main

    result = CliRunner().invoke(main, ["--prompt", "x", "--gen-length", "\uff13\uff12"])
    assert result.exit_code == 2 and "ASCII digits" in result.output


# --- files a start-up option names: confined, and a bad file is one line ---

def _adapter(tmp_path, name):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8,
                                                            "target_modules": ["q_proj"]}))
    return folder


def test_an_adapter_file_linking_outside_its_folder_is_refused(tmp_path):
    from dllm_decode.adapters import AdapterError, read_adapter

    outside = tmp_path / "elsewhere.safetensors"
    outside.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    folder = _adapter(tmp_path, "linked")
    (folder / "adapter_model.safetensors").symlink_to(outside)
    with pytest.raises(AdapterError, match="links outside the adapter folder"):
        read_adapter(folder)
    config = _adapter(tmp_path, "config_linked") / "adapter_config.json"
    config.unlink()
    config.symlink_to(tmp_path / "linked" / "adapter_config.json")
    with pytest.raises(AdapterError, match="links outside the adapter folder"):
        read_adapter(config.parent)


@pytest.mark.parametrize("config, weights", [("[" * 100000 + "]" * 100000, None), (None, b"\xff" * 64),
                                             (None, b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":")])
def test_a_corrupt_adapter_is_one_line(tmp_path, config, weights):
    from dllm_decode.adapters import AdapterError, read_adapter

    folder = _adapter(tmp_path, "bad")
    if config is not None:
        (folder / "adapter_config.json").write_text(config)
    (folder / "adapter_model.safetensors").write_bytes(weights or b"")
    with pytest.raises(AdapterError) as err:
        read_adapter(folder)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name, data", [("t.safetensors", b"\xff" * 64), ("t.json", b"[" * 100000 + b"]" * 100000),
                                        ("t.json", b"[1, 2]"), ("t.json", b'{"num_token": 3, "p_baseline_dict": {"a": 1}}'),
                                        ("t.safetensors", b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")])
def test_a_corrupt_frequency_table_is_one_line(tmp_path, name, data):
    from dllm_decode.schedulers.frequency import read_table

    (tmp_path / name).write_bytes(data)
    with pytest.raises(ValueError) as err:
        read_table(tmp_path / name)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("where", ["model.safetensors", "config.json", "sub/../tokenizer.json", "new/trace.html"])
def test_trace_html_never_lands_in_the_model_folder(tmp_path, where):
    import shutil

    from click.testing import CliRunner

    from dllm_decode.cli import main
    from dllm_decode.models.checkpoint import EMBEDDED_DIR

    model = tmp_path / "model"
    shutil.copytree(EMBEDDED_DIR / "dllm", model)
    before = {p.name: p.read_bytes() for p in model.iterdir()}
    result = CliRunner().invoke(main, ["--model", str(model), "--prompt", "x", "--gen-length", "8",
                                       "--block-length", "8", "--trace-html", f"{model}/{where}"])
    assert result.exit_code == 2 and "inside this run's input" in result.output
    assert {p.name: p.read_bytes() for p in model.iterdir()} == before


# --- a server's own counts are bounded up front, from the CLI and from Python ---

@pytest.mark.parametrize("option, value", [("--max-concurrent", "1000000000"), ("--max-queue", str(10**9)),
                                           ("--max-tokens", str(10**12)), ("--max-body-bytes", str(1 << 40))])
def test_serve_counts_are_bounded(option, value):
    from click.testing import CliRunner

    from dllm_decode.cli import main

    result = CliRunner().invoke(main, ["serve", option, value])
    assert result.exit_code == 2 and "range" in result.output


def test_server_records_bound_their_counts():
    from dllm_decode.cost import MAX_ROWS
    from dllm_decode.engine import Engine
    from dllm_decode.serve.app import Limits

    with pytest.raises(ValueError, match="max_batch_size"):
        Engine(None, max_batch_size=MAX_ROWS + 1)
    with pytest.raises(ValueError, match="max_queue"):
        Limits(max_queue=16 * MAX_ROWS + 1)


@pytest.mark.parametrize("body", [{"prompt": "x", "model": "/etc"}, {"prompt": "x", "model": "other"},
                                  {"prompt": "x", "model": ["m"]}, {"prompt": "x", "modle": "m"},
                                  {"prompt": "x", "model": "m:nope"}])
def test_tokenize_never_ignores_a_model_or_a_key(body):
    """/tokenize answers for the served model only, like /v1/completions, and refuses keys it
    does not know instead of ignoring them."""
    from types import SimpleNamespace

    from dllm_decode.serve.router_compat import tokenize

    settings = SimpleNamespace(model_id="m", adapters=("one",), presets={"fast": None})
    engine = SimpleNamespace(model=SimpleNamespace(max_length=64))
    state = SimpleNamespace(settings=settings, tokenizer=lambda text, add_special_tokens: {"input_ids": [1]},
                            worker=SimpleNamespace(engine=engine))
    with pytest.raises(ValueError) as err:
        tokenize(state, body)
    assert "\n" not in str(err.value)
    for model in ("m", "m:one", "m:fast", None):
        assert tokenize(state, {"prompt": "x", **({} if model is None else {"model": model})})["count"] == 1


@pytest.mark.parametrize("change", ["alpha_inf", "alpha_huge", "r_bool", "nan_weights", "int_weights"])
def test_an_adapter_that_would_poison_the_logits_is_refused_at_load(tmp_path, change):
    """A LoRA folder with an infinite scale or NaN/integer weights is an AdapterError naming the
    folder, not a decode that fails later on NaN logits."""
    import torch
    from safetensors.torch import save_file

    from dllm_decode.adapters import AdapterError, read_adapter

    folder = _adapter(tmp_path, "lora")
    config = json.loads((folder / "adapter_config.json").read_text())
    config.update({"alpha_inf": {"lora_alpha": float("inf")}, "alpha_huge": {"lora_alpha": 1e300},
                   "r_bool": {"r": True}}.get(change, {}))
    (folder / "adapter_config.json").write_text(json.dumps(config))
    a, b = torch.ones(4, 8), torch.ones(8, 4)
    if change == "nan_weights":
        a[0, 0] = float("nan")
    if change == "int_weights":
        a, b = a.to(torch.int8), b.to(torch.int8)
    save_file({"base_model.model.layer.q_proj.lora_A.weight": a, "base_model.model.layer.q_proj.lora_B.weight": b},
              str(folder / "adapter_model.safetensors"))
    with pytest.raises(AdapterError) as err:
        read_adapter(folder)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("value", ["../x=DIR", "a/b=DIR", ".hidden=DIR", "a..b=DIR", "x:y=DIR", "=DIR", "x="])
def test_an_adapter_name_is_a_plain_name_never_a_path(value):
    import click

    from dllm_decode.cli.adapters import split_adapters

    with pytest.raises(click.BadParameter, match="a name, never a path"):
        split_adapters((value,), named_ok=True)
    assert split_adapters(("math-v2.1=DIR",), named_ok=True).named == (("math-v2.1", "DIR"),)
