"""Issue 21, class by class: every value is checked once at the edge, with one line naming the bad
value and what is accepted (API: ValueError/TypeError; CLI: exit 2; server: 400).

Each test here failed on the code before the fix (a traceback, a late error or an accepted bad
value), one test per class rather than per probe case.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import typing
from pathlib import Path

import click
import pytest
import torch
from click.testing import CliRunner

from dllm_decode.cli import main
from dllm_decode.config import DecodeConfig
from dllm_decode.models.checkpoint import EMBEDDED_DIR, ModelLoadError
from dllm_decode.registry import HOMES, build, registry

ROOT_ONLY_PROC = Path("/proc/self").is_dir()


def invoke(args: list[str]):
    return CliRunner().invoke(main, args)


def usage_error(result, *words: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    for word in words:
        assert word in result.output, result.output


# ---- 1. one field check for every registered component --------------------------------------

def _fields(kind: str):
    for name, cls in sorted(registry(kind).items()):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            annotation = hints[f.name]
            base = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
            if len(base) == 1 and base[0] in (int, float, bool):
                yield pytest.param(cls, f.name, base[0], id=f"{kind}-{name}-{f.name}")


FIELDS = [p for kind in HOMES for p in _fields(kind)]
BAD = {int: [1.5, True, "3"], float: [math.nan, "x", True], bool: ["no", 0, None]}


@pytest.mark.parametrize("cls,field,kind", FIELDS)
def test_every_component_field_refuses_the_wrong_type(cls, field, kind):
    optional = type(None) in typing.get_args(typing.get_type_hints(cls)[field])
    for value in BAD[kind]:
        if value is None and optional:
            continue
        with pytest.raises((TypeError, ValueError)) as err:
            cls(**{field: value})
        message = str(err.value)
        assert field in message, message
        if isinstance(err.value, TypeError) and f"{cls.__name__}.{field}" in message:
            assert repr(value) in message and "must be" in message
    if kind is float and field not in getattr(cls, "infinite_ok", ()):
        with pytest.raises(ValueError, match=field):
            cls(**{field: math.inf})
    if kind is int:                       # counts reach torch as int64: refused before they overflow
        for huge in (2 ** 63, -(2 ** 63) - 1):
            with pytest.raises(ValueError, match=field):
                cls(**{field: huge})


def test_documented_infinity_stays_valid():
    from dllm_decode.schedulers import SCHEDULERS

    assert SCHEDULERS["entropy_threshold"](threshold=math.inf).threshold == math.inf
    assert SCHEDULERS["eb"](gamma=math.inf).gamma == math.inf
    assert SCHEDULERS["adaptive_block"](delimiter_threshold=math.inf).delimiter_threshold == math.inf


def test_registry_text_options_reach_the_same_check():
    from dllm_decode.schedulers import SCHEDULERS

    with pytest.raises(ValueError, match="factor"):
        build(SCHEDULERS, "factor", {"factor": "inf"})
    with pytest.raises(ValueError, match="radius"):
        build(SCHEDULERS, "local_leap", {"radius": 1.5})
    with pytest.raises(ValueError, match="steps_per_block"):
        DecodeConfig.from_dict({"scheduler": {"name": "low_confidence", "steps_per_block": True}})
    with pytest.raises(TypeError, match="registry name"):
        DecodeConfig.from_dict({"scheduler": 5})


def test_decode_and_spec_records_check_their_types():
    from dllm_decode.schedulers import SCHEDULERS
    from dllm_decode.speculative import SpecConfig
    from dllm_decode.speculative.sampling import Sampling

    for value in ("no", 0):
        with pytest.raises(TypeError, match="stop_at_eos"):
            DecodeConfig(scheduler=SCHEDULERS["threshold"](), stop_at_eos=value)
    rule = SCHEDULERS["threshold"]()
    with pytest.raises(TypeError, match="max_draft"):
        SpecConfig(scheduler=rule, max_draft=2.5)
    with pytest.raises(TypeError, match="sampling"):
        SpecConfig(scheduler=rule, sampling=None)
    with pytest.raises(TypeError, match="top_k"):
        Sampling(top_k=1.5)
    from dllm_decode.speculative import TreeShape

    with pytest.raises(TypeError, match="TreeShape.branch"):
        TreeShape(branch="2")


def test_scheduler_ids_are_checked_against_the_model():
    from dllm_decode import generate
    from dllm_decode.schedulers import SCHEDULERS
    from dllm_decode.schedulers.oracle import OracleScheduler
    from dllm_decode.testing import tiny_llada

    model = tiny_llada()
    with pytest.raises(TypeError, match="reference"):
        OracleScheduler(reference="abc")
    for reference, word in (((99999,) * 8, "vocabulary"), ((5,) * 3, "gen_length")):
        config = DecodeConfig(scheduler=OracleScheduler(reference=(reference,)), gen_length=8, block_length=8)
        with pytest.raises(ValueError, match=word):
            generate(model, [[5, 6]], config)
    config = DecodeConfig(scheduler=SCHEDULERS["adaptive_block"](delimiter_ids=(99999,)), gen_length=8,
                          block_length=8)
    with pytest.raises(ValueError, match="delimiter_ids"):
        generate(model, [[5, 6]], config)


# ---- 2. writability: really create the file -------------------------------------------------

@pytest.mark.skipif(not ROOT_ONLY_PROC, reason="needs /proc")
def test_output_paths_are_tried_before_any_work(tmp_path):
    from dllm_decode.cli.options import writable_dir, writable_file

    with pytest.raises(click.BadParameter):
        writable_file("/proc/probe_bench.json", "--json")
    with pytest.raises(click.BadParameter):
        writable_dir("/proc/probe_cache", "--cache-dir")
    kept = tmp_path / "kept.json"
    kept.write_text("abc")
    writable_file(str(kept), "--json")
    assert kept.read_text() == "abc"
    fresh = tmp_path / "sub" / "new.json"
    writable_file(str(fresh), "--json")
    assert not fresh.exists() and fresh.parent.is_dir()
    usage_error(invoke(["fetch", "smollm2", "--cache-dir", "/proc/probe_cache"]), "--cache-dir")
    usage_error(invoke(["bench", "gap", "--quick", "--json", "/proc/probe_bench.json"]), "--json")


# ---- 3. model config checks on load ---------------------------------------------------------

def _variant(tmp_path: Path, source: str = "dllm", **changes) -> Path:
    directory = tmp_path / source
    shutil.copytree(EMBEDDED_DIR / source, directory)
    config = json.loads((directory / "config.json").read_text())
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.mark.parametrize("changes,word", [
    ({"vocab_size": -5}, "vocab_size"),
    ({"d_model": "192"}, "d_model"),
    ({"max_sequence_length": "long"}, "max_sequence_length"),
    ({"pad_token_id": 9999}, "pad_token_id"),
], ids=["vocab-negative", "dmodel-text", "maxlen-text", "pad-outside"])
def test_model_config_values_are_one_line_errors(tmp_path, changes, word):
    from dllm_decode.models import load_model

    with pytest.raises(ModelLoadError, match=word):
        load_model(_variant(tmp_path, **changes))


def test_model_paths_say_what_is_wrong(tmp_path):
    from dllm_decode.models import load_model
    from dllm_decode.modelspec import ModelSpec

    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="is a file, not a directory"):
        load_model(tmp_path / "weights.bin")
    with pytest.raises(ModelLoadError, match="empty"):
        load_model("")
    with pytest.raises(ModelLoadError, match="ar:ar_target"):
        load_model("ar_target")
    bad = tmp_path / "latin1"
    bad.mkdir()
    (bad / "config.json").write_bytes(b'{"model_type": "llada\xff"}')
    with pytest.raises(ModelLoadError, match="config.json is not UTF-8"):
        load_model(bad)
    with pytest.raises(ValueError, match="unknown runtime 'bogus'"):
        ModelSpec.parse("ar:ar_target@bogus")


def test_causal_lm_config_and_weights_must_agree(tmp_path):
    from dllm_decode.models.causal import load_causal_lm

    with pytest.raises(ModelLoadError, match="eos_token_id"):
        load_causal_lm(str(_variant(tmp_path, "ar_target", eos_token_id=500)))
    other = tmp_path / "small"
    other.mkdir()
    with pytest.raises(ModelLoadError, match="weights do not match"):
        load_causal_lm(str(_variant(other, "ar_target", vocab_size=50)))


# ---- 4. server: validated before decoding ---------------------------------------------------

def test_server_requests_are_checked_like_the_cli():
    from dllm_decode.engine import Engine, Request
    from dllm_decode.schedulers import SCHEDULERS
    from dllm_decode.serve.protocol import APIError, Settings, parse_job
    from dllm_decode.testing import tiny_llada

    model = tiny_llada()
    config = DecodeConfig(scheduler=SCHEDULERS["threshold"](), gen_length=8, block_length=8)
    settings = Settings(model_id="tiny", config=config)
    for body, param in (({"prompt": [5], "dllm": {"stop_at_eos": "no"}}, "dllm"),
                        ({"prompt": [5], "stream_options": {"include_usage": True}}, "stream_options")):
        with pytest.raises(APIError) as err:
            parse_job("completion", body, settings, None)
        assert err.value.status == 400 and str(err.value.param).startswith(param)
    engine = Engine(model)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.check(Request(id="a", prompt=(999999, 5), config=config))
    block = dataclasses.replace(config, cache=registry("cache")["block"]())
    with pytest.raises(ValueError, match="block"):
        engine.check(Request(id="b", prompt=(5,), config=block))
    ada = dataclasses.replace(config, scheduler=SCHEDULERS["adaptive_block"](delimiter_ids=(99999,)))
    with pytest.raises(ValueError, match="delimiter_ids"):
        engine.check(Request(id="c", prompt=(5,), config=ada))


def test_server_body_nested_too_deep_is_a_400():
    from dllm_decode.serve.app import _parse
    from dllm_decode.serve.protocol import APIError

    with pytest.raises(APIError, match="nested"):
        _parse(b"[" * 100000 + b"]" * 100000)


def test_serve_refuses_before_loading():
    import socket

    usage_error(invoke(["serve", "--model", "tiny", "--served-model-name", ""]), "--served-model-name")
    usage_error(invoke(["serve", "--model", "tiny", "--cache", "block", "--port", "0"]), "block")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = str(holder.getsockname()[1])
        usage_error(invoke(["serve", "--model", "/nonexistent", "--port", port]), "--port")


# ---- 5. API arguments -----------------------------------------------------------------------

def test_load_model_checks_device_and_dtype_like_the_cli():
    from dllm_decode.models import load_model

    for device, error in (("bogus", ValueError), (3.5, TypeError)):
        with pytest.raises(error, match="device"):
            load_model("embedded", device=device)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="not available"):
            load_model("embedded", device="cuda")
    with pytest.raises(ValueError, match="floating"):
        load_model("embedded", dtype=torch.int64)
    with pytest.raises(ValueError, match="float32"):
        load_model("embedded", dtype="float64")


def test_decoding_keys_and_generate_arguments():
    from dllm_decode import Decoding, generate
    from dllm_decode.caches import CACHES
    from dllm_decode.schedulers import SCHEDULERS
    from dllm_decode.testing import tiny_llada_with_tokenizer

    model = tiny_llada_with_tokenizer()
    config = DecodeConfig(scheduler=SCHEDULERS["threshold"](), gen_length=8, block_length=8)
    decoding = Decoding(model, CACHES["none"]())
    for call in (decoding.result, decoding.snapshot, decoding.nfe_of):
        with pytest.raises(ValueError, match="nokey"):
            call("nokey")
    key = decoding.add([[5, 6]], config)
    with pytest.raises(ValueError, match="still decoding"):
        decoding.result(key)
    with pytest.raises(KeyError):                        # still a KeyError for old callers
        decoding.result("nokey")
    with pytest.raises(ValueError, match="surrogate"):
        generate(model, ["w1 " + chr(0xDCFF) + " w2"], config)
    with pytest.raises(TypeError, match="trace"):
        generate(model, [[5]], config, trace="yes")
    with pytest.raises(TypeError, match="tokenizer"):
        generate(model, [[5]], config, tokenizer="x")


def test_speculative_api_arguments():
    from dllm_decode.schedulers import SCHEDULERS
    from dllm_decode.speculative import SpecConfig, speculative_generate
    from dllm_decode.speculative.drafters.layerskip import layer_subset
    from dllm_decode.speculative.drafters import DraftContext, make_drafter
    from dllm_decode.speculative.loop import eos_ids_of
    from dllm_decode.models.causal import load_causal_lm
    from dllm_decode.speculative.verify import greedy_verify, speculative_verify
    from dllm_decode.testing import tiny_llada

    art = load_causal_lm("ar_target")
    config = SpecConfig(scheduler=SCHEDULERS["threshold"](), max_new_tokens=4)
    for prompt in ([99999], [-3]):
        with pytest.raises(ValueError, match="vocabulary"):
            speculative_generate(art, prompt, config)
    with pytest.raises(TypeError, match="SpecConfig"):
        speculative_generate(art, [5, 6], {"max_new_tokens": 4})
    with pytest.raises(TypeError, match="causal LM"):
        speculative_generate(tiny_llada(), [5, 6], config)
    with pytest.raises(ValueError, match="eos_ids"):
        speculative_generate(art, [5, 6], config, eos_ids=[99999])
    with pytest.raises(TypeError, match="draft"):
        make_drafter(None, DraftContext(art, torch.device("cpu")))
    for layers in ([99], []):
        with pytest.raises(ValueError, match="layer"):
            layer_subset(art, layers)
    with pytest.raises(TypeError):
        eos_ids_of(None)
    p = torch.full((2, 10), 0.1)
    with pytest.raises(ValueError, match="target_probs"):
        speculative_verify(torch.tensor([1, 2]), p, p, None)
    with pytest.raises(ValueError, match="drafts"):
        greedy_verify(torch.tensor([1.0, 2.0]), torch.zeros(3, 10))
    with pytest.raises(ValueError, match="probabilities"):
        speculative_verify(torch.tensor([1]), None, torch.full((2, 10), math.nan), None)


# ---- 6. eval and bench sub-options ----------------------------------------------------------

def test_eval_refuses_a_block_the_answer_canvas_cannot_use(tmp_path):
    result = invoke(["eval", "--model", "tiny", "--tasks", "copy", "--limit", "1", "--gen-length",
                     "answer", "--block-length", "5", "--no-plots", "--out", str(tmp_path / "e")])
    usage_error(result, "block_length 5")


def test_bench_sub_options_fail_before_work():
    usage_error(invoke(["bench", "serving", "--requests", "2", "--clients", "1", "--block-length", "3"]),
                "--block-length")
    usage_error(invoke(["bench", "spec", "--quick", "--target", "bogus"]), "--target")
    usage_error(invoke(["bench", "tree", "--draft", "bogus"]), "--draft")
    usage_error(invoke(["spec", "--tree-min-prob", "nan", "--prompt", "x"]), "nan")


def test_deeply_nested_json_lines_are_one_line_errors(tmp_path):
    from dllm_decode.eval.harness.records import read_records

    source = tmp_path / "in.jsonl"
    source.write_text('{"prompt": "w1", "dllm": ' + "[" * 100000 + "]" * 100000 + "}\n")
    usage_error(invoke(["--model", "tiny", "--gen-length", "8", "--block-length", "8", "--input", str(source),
                        "--output", str(tmp_path / "out.jsonl")]), "nested too deeply")
    samples = tmp_path / "samples.jsonl"
    samples.write_text("[" * 100000 + "]" * 100000 + "\n" + '{"a": 1}\n')
    with pytest.raises(ValueError, match="not valid JSON"):
        read_records(samples)


def test_ideal_model_noise_must_be_finite():
    usage_error(invoke(["--model", "ideal:noise=nan", "--gen-length", "8", "--block-length", "8",
                        "--prompt", "copy : mia"]), "noise")



def test_records_refuse_a_non_sequence_in_one_line():
    """A bare int where a list belongs names the field, never Python's 'not iterable'."""
    from dllm_decode.engine import Engine, Request
    from dllm_decode.schedulers import ThresholdScheduler
    from dllm_decode.testing import tiny_llada

    config = DecodeConfig(scheduler=ThresholdScheduler(), gen_length=4, block_length=4)
    with pytest.raises(TypeError, match="prompt must be a list of token ids"):
        Request("r", 5, config)
    with pytest.raises(TypeError, match="filters must be a list"):
        DecodeConfig(scheduler=ThresholdScheduler(), filters=5)
    with pytest.raises(TypeError, match="Engine.add takes a Request"):
        Engine(tiny_llada()).add(5)
