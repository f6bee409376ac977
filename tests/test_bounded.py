"""Bounded by construction, class by class: no request reaches a file or an unbounded cost, no
resume mixes runs, no option contradicts another, no traceback.

Each test failed on the code before the fix (a file opened from a request, an accepted bad
value, a silent mix, a traceback): one test per class, enumerating the class where it can.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import typing

import pytest
import torch
from click.testing import CliRunner

from dllm_decode.cli import main
from dllm_decode.config import DecodeConfig
from dllm_decode.registry import HOMES, component, registry

PROBE = "zzprobe"
REQUEST_KINDS = ("scheduler", "cache", "filter")


def invoke(args: list[str], **kwargs):
    return CliRunner().invoke(main, args, **kwargs)


def usage_error(result, *words: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    for word in words:
        assert word in result.output, (word, result.output)


def _settings(**extra):
    from dllm_decode.serve.protocol import Settings

    config = DecodeConfig(scheduler=component("scheduler", "threshold"), gen_length=16, block_length=8)
    return Settings(model_id="embedded", config=config, max_tokens=64, **extra)


def _text_fields(cls: type) -> list[dataclasses.Field]:
    hints = typing.get_type_hints(cls)
    return [f for f in dataclasses.fields(cls) if str in (hints[f.name], *typing.get_args(hints[f.name]))]


def _wrappers() -> list[tuple[str, str]]:
    """(name, field) of every registered scheduler with a component-typed field (`base`)."""
    out = []
    for name, cls in registry("scheduler").items():
        hints = typing.get_type_hints(cls)
        out += [(name, f.name) for f in dataclasses.fields(cls)
                if any(isinstance(t, type) and hasattr(t, "select") for t in (hints[f.name], *typing.get_args(hints[f.name])))]
    return out


@pytest.fixture
def opened(tmp_path, monkeypatch):
    """Files named PROBE(.json/.safetensors) in the working directory, and the list of every
    attempt to open or stat one of them (an audit hook sees `open`; `os.stat` is wrapped)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / f"{PROBE}.json").write_text(json.dumps({"num_token": 10, "p_baseline_dict": {"5": 1}}))
    for name in (PROBE, f"{PROBE}.safetensors"):
        (tmp_path / name).write_bytes(b"\0" * 64)
    seen: list[str] = []
    active = [True]

    def hook(event, args):
        if active[0] and event == "open" and args and PROBE in str(args[0]):
            seen.append(str(args[0]))

    sys.addaudithook(hook)
    real_stat = os.stat

    def stat(path, *a, **k):
        if PROBE in str(path):
            seen.append(str(path))
        return real_stat(path, *a, **k)

    monkeypatch.setattr(os, "stat", stat)
    yield seen
    active[0] = False


# ---- 1. files are reachable only from start-up options ------------------------------------------

def test_no_request_value_reaches_the_filesystem(embedded, opened):
    """Every text field of every request-selectable component (and, through every wrapper's
    `base`, of every scheduler), given a name of a file that exists, is either refused or never
    opened: building the request and checking it against the model touches no such file."""
    from dllm_decode.serve.protocol import APIError, parse_job

    settings = _settings()
    cases = []
    for kind in REQUEST_KINDS:
        for name, cls in registry(kind).items():
            for field in _text_fields(cls):
                for value in (PROBE, f"{PROBE}.json", f"{PROBE}.safetensors"):
                    spec = {"name": name, field.name: value}
                    cases.append({"filters": [spec]} if kind == "filter" else {kind: spec})
                    if kind == "scheduler":
                        for wrapper, slot in _wrappers():
                            cases.append({"scheduler": {"name": wrapper, slot: spec}})
    assert len(cases) > 100
    for dllm in cases:
        try:
            job = parse_job("completion", {"prompt": "sort : bob amy", "dllm": dllm}, settings, embedded.tokenizer)
        except APIError:
            continue
        job.config.scheduler.check_fits(embedded.vocab_size, job.config.gen_length)
        assert not opened, (dllm, opened)


def test_file_options_are_declared_by_their_type_and_refused_from_requests(embedded):
    from dllm_decode.fields import names_file
    from dllm_decode.serve.protocol import APIError, parse_job

    marked = [(kind, name, f.name) for kind in REQUEST_KINDS for name, cls in registry(kind).items()
              for f in dataclasses.fields(cls) if names_file(f)]
    assert ("scheduler", "pc_sampler", "table") in marked and ("filter", "learned", "weights") in marked
    for kind, name, field in marked:
        spec = {"name": name, field: "some-table.json"}
        dllm = {"filters": [spec]} if kind == "filter" else {kind: spec}
        with pytest.raises(APIError, match="names a file") as caught:
            parse_job("completion", {"prompt": "sort : bob", "dllm": dllm}, _settings(), embedded.tokenizer)
        assert caught.value.status == 400
    # shipped names need no file and stay allowed
    job = parse_job("completion", {"prompt": "sort : bob", "dllm": {"scheduler": {
        "name": "credit", "base": {"name": "pc_sampler", "table": "uniform"}}}}, _settings(), embedded.tokenizer)
    assert job.config.scheduler.base.table == "uniform"


# ---- 2. every request has a cost bound --------------------------------------------------------

def test_every_bounded_count_is_refused_above_its_bound():
    from dllm_decode.fields import scaling_fields

    bounded = [(kind, name, field, most) for kind in HOMES for name, cls in registry(kind).items()
               for field, most in scaling_fields(cls).items()]
    assert ("scheduler", "info_gain", "candidates", 64) in bounded and len(bounded) >= 15
    for kind, name, field, most in bounded:
        with pytest.raises(ValueError, match=f"{field} must be <= {most}"):
            component(kind, {"name": name, field: most + 1})
    with pytest.raises(ValueError, match="candidates"):
        component("scheduler", {"name": "info_gain", "candidates": 10 ** 7})


def test_the_server_refuses_a_request_over_its_budget_naming_the_option(embedded):
    from dllm_decode.serve.protocol import APIError, parse_job

    settings = _settings(max_request_bytes=1 << 20, vocab_size=embedded.vocab_size)
    body = {"prompt": "sort : bob amy", "dllm": {"scheduler": {"name": "credit", "base": {
        "name": "info_gain", "candidates": 64}}}}
    with pytest.raises(APIError) as caught:
        parse_job("completion", body, settings, embedded.tokenizer)
    assert caught.value.status == 400 and caught.value.param == "dllm.scheduler.base.candidates"
    assert "budget" in caught.value.message
    # the same request fits a larger budget, and the default record fits this one
    parse_job("completion", body, _settings(max_request_bytes=1 << 30, vocab_size=embedded.vocab_size),
              embedded.tokenizer)
    parse_job("completion", {"prompt": "sort : bob amy"}, settings, embedded.tokenizer)


@pytest.mark.parametrize("args, words", [
    (["serve", "--threads", "512"], ["--threads"]),
    (["tune", "--calibration", "100000000", "--out", "x"], ["--calibration"]),
    (["eval", "--limit", "100000000", "--out", "x"], ["--limit"]),
    (["tune", "--gen-length", "³", "--out", "x"], ["--gen-length"]),
    (["eval", "--gen-length", "99999999999", "--out", "x"], ["--gen-length"]),
])
def test_counts_are_bounded_up_front(args, words):
    usage_error(invoke(args), *words)


def test_task_and_split_sizes_are_bounded_from_python():
    from dllm_decode.eval.tasks.sources import select_tasks
    from dllm_decode.eval.tune.search import split

    with pytest.raises(ValueError, match="limit"):
        select_tasks("copy", limit=10 ** 8)
    with pytest.raises(ValueError, match="calibration"):
        split([], 10 ** 8, "salt")


# ---- 3. paths ------------------------------------------------------------------------------------

def test_the_cache_exception_needs_a_real_cache_layout(tmp_path):
    from dllm_decode.models.checkpoint import ModelLoadError, read_safetensors, resolve_model_dir

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.copy(resolve_model_dir("embedded") / "model.safetensors", outside / "w.safetensors")
    snapshot = tmp_path / "models--x--y" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    os.symlink(outside, tmp_path / "models--x--y" / "blobs")          # a planted `blobs` link
    os.symlink("../../blobs/w.safetensors", snapshot / "model.safetensors")
    with pytest.raises(ModelLoadError, match="outside the checkpoint folder"):
        read_safetensors(snapshot)
    # a real layout (a `blobs` folder of the same repository) still loads
    os.unlink(tmp_path / "models--x--y" / "blobs")
    shutil.copytree(outside, tmp_path / "models--x--y" / "blobs")
    assert read_safetensors(snapshot)


def test_lock_files_never_follow_links_nor_truncate_other_files(tmp_path):
    from dllm_decode.outputs import OutputError, output_lock

    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    target = tmp_path / "out.jsonl"
    os.symlink(victim, tmp_path / "out.jsonl.lock")
    with pytest.raises(OutputError, match="symbolic link"):
        with output_lock(target):
            pass
    os.unlink(tmp_path / "out.jsonl.lock")
    os.link(victim, tmp_path / "out.jsonl.lock")                      # a hard link
    with pytest.raises(OutputError, match="not a lock file"):
        with output_lock(target):
            pass
    os.unlink(tmp_path / "out.jsonl.lock")
    (tmp_path / "out.jsonl.lock").write_text("not a pid, someone's notes")
    with pytest.raises(OutputError, match="not a lock file"):
        with output_lock(target):
            pass
    assert victim.read_text() == "keep me"
    os.unlink(tmp_path / "out.jsonl.lock")
    for _ in range(2):                                                # its own lock is reused
        with output_lock(target):
            assert (tmp_path / "out.jsonl.lock").read_text() == str(os.getpid())


def test_preset_model_hashing_streams_the_weights(tmp_path, monkeypatch):
    import pathlib

    from dllm_decode.eval.harness.presets import model_identity
    from dllm_decode.models.checkpoint import resolve_model_dir

    folder = resolve_model_dir("embedded")
    expected = model_identity("embedded", folder)
    assert "weights_sha256" in expected

    def whole(self):
        raise MemoryError("read whole")

    monkeypatch.setattr(pathlib.Path, "read_bytes", whole)
    assert model_identity("embedded", folder) == expected


# ---- 4. resume keys on the run --------------------------------------------------------------------

def test_batch_resume_with_another_run_is_an_error_naming_what_changed(tmp_path):
    requests = tmp_path / "in.jsonl"
    requests.write_text(json.dumps({"id": "a", "prompt": "sort : bob amy"}) + "\n")
    out = str(tmp_path / "out.jsonl")
    base = ["--input", str(requests), "--output", out, "--gen-length", "8", "--block-length", "8"]
    assert invoke(base).exit_code == 0
    assert invoke(base).exit_code == 0                                # the same run resumes
    usage_error(invoke([*base, "--scheduler", "low_confidence"]), "scheduler", "another run")
    usage_error(invoke([*base, "--model", "embedded-bd"]), "model 'embedded' -> 'embedded-bd'")
    assert len(open(out).read().splitlines()) == 1


def test_eval_resume_with_a_changed_model_is_an_error(tmp_path):
    from dllm_decode.eval.harness.runner import same_model

    same_model(tmp_path, {"name": "m", "config_sha256": "a"})
    same_model(tmp_path, {"name": "m", "config_sha256": "a"})
    same_model(tmp_path, {"name": "other"})                           # a second model may join
    with pytest.raises(ValueError, match="config or weights differ"):
        same_model(tmp_path, {"name": "m", "config_sha256": "b"})


# ---- 5. options checked as a whole ----------------------------------------------------------------

@pytest.mark.parametrize("spec, word", [
    ({"name": "hierarchy", "low_threshold": 0.95}, "low_threshold"),
    ({"name": "slowfast", "high_threshold": 1.5}, "high_threshold"),
    ({"name": "adaptive_block", "delimiter_threshold": 2.0}, "delimiter_threshold"),
])
def test_contradictory_fields_are_refused(spec, word):
    with pytest.raises(ValueError, match=word):
        component("scheduler", spec)


def test_sub_blocks_must_tile_the_canvas_at_every_entry_point(embedded):
    from dllm_decode.serve.protocol import APIError, parse_job

    with pytest.raises(ValueError, match="sub_block"):
        DecodeConfig(scheduler=component("scheduler", {"name": "credit", "base": {
            "name": "multi_block", "sub_block": 7}}), gen_length=16, block_length=16)
    with pytest.raises(APIError, match="sub_block"):
        parse_job("completion", {"prompt": "sort : bob", "dllm": {"scheduler": {"name": "multi_block", "sub_block": 7},
                                                                   "gen_length": 16}}, _settings(), embedded.tokenizer)
    usage_error(invoke(["--scheduler", "multi_block", "-o", "sub_block=7", "--gen-length", "16",
                        "--prompt", "sort : bob"]), "sub_block")


def _presets(tmp_path, parts):
    path = tmp_path / "presets.json"
    path.write_text(json.dumps({"presets": {"overall": {"parts": parts}}}))
    return str(path)


def test_a_preset_is_checked_whole_even_where_the_command_line_overrides_it(tmp_path):
    path = _presets(tmp_path, {"scheduler": {"name": "threshold"}, "block_length": 0})
    usage_error(invoke(["--preset", path, "--block-length", "8", "--gen-length", "8", "--prompt", "sort : bob"]),
                "block_length")
    path = _presets(tmp_path, {"scheduler": {"name": "low_confidence"}, "tokens_per_step": 0})
    usage_error(invoke(["--preset", path, "--prompt", "sort : bob"]), "tokens_per_step")


def test_a_preset_keeps_its_temperature_and_seed_unless_overridden_and_says_so(tmp_path):
    path = _presets(tmp_path, {"scheduler": {"name": "threshold"}, "temperature": 0.5, "seed": 7})
    kept = invoke(["--preset", path, "--gen-length", "8", "--block-length", "8", "--prompt", "sort : bob", "--json"])
    assert kept.exit_code == 0, kept.output
    record = json.loads(kept.stdout.strip().splitlines()[-1])["config"]
    assert record["temperature"] == 0.5 and record["seed"] == 7
    moved = invoke(["--preset", path, "--gen-length", "8", "--block-length", "8", "--prompt", "sort : bob", "--json",
                    "--temperature", "0"])
    assert moved.exit_code == 0 and "overrides the preset's temperature 0.5" in moved.stderr


# ---- 6. one line, never a traceback -------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.bool])
def test_integer_weights_are_one_line(tmp_path, dtype):
    from safetensors.torch import load_file, save_file

    from dllm_decode.models.checkpoint import resolve_model_dir

    shutil.copytree(resolve_model_dir("embedded"), tmp_path / "m")
    state = load_file(str(tmp_path / "m" / "model.safetensors"))
    save_file({k: v.to(dtype) for k, v in state.items()}, str(tmp_path / "m" / "model.safetensors"))
    usage_error(invoke(["--model", str(tmp_path / "m"), "--prompt", "sort : bob"]), "floating point")


def test_float8_is_a_storage_format_not_a_compute_dtype():
    from dllm_decode.models.loading import load_model

    with pytest.raises(ValueError, match="storage format"):
        load_model("embedded", dtype=torch.float8_e4m3fn)


@pytest.mark.parametrize("template", ["{{ raise_exception('no system role') }}",
                                      "{{ ''.__class__.__mro__ }}",
                                      "{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}"])
def test_chat_templates_that_fail_are_one_line(embedded, template):
    import copy

    from dllm_decode.prompts import chat_prompt
    from dllm_decode.serve.protocol import APIError, parse_job

    tokenizer = copy.copy(embedded.tokenizer)
    tokenizer.chat_template = template
    with pytest.raises(ValueError, match="chat template"):
        chat_prompt(tokenizer, "sort : bob")
    with pytest.raises(APIError) as caught:
        parse_job("chat", {"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "sort : bob"}]},
                  _settings(), tokenizer)
    assert caught.value.status == 400


def test_a_deeply_nested_presets_file_is_one_line(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text('{"presets": ' + "[" * 50_000 + "]" * 50_000 + "}")
    usage_error(invoke(["--preset", str(path), "--prompt", "sort : bob"]), "nested too deeply")


def test_a_small_machine_refuses_bench_shaped_naming_a_depth_that_fits(monkeypatch):
    from dllm_decode.eval.bench import shaped

    monkeypatch.setattr(shaped, "device_memory", lambda device: 2 << 30)
    usage_error(invoke(["bench", "shaped"]), "--layers", "GiB")


def test_a_library_writer_on_a_full_disk_is_one_line(tmp_path):
    from dllm_decode.outputs import OutputError, write_with

    class SafetensorError(Exception):
        pass

    def writer(path):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    with pytest.raises(OutputError, match="no space left on device"):
        write_with(tmp_path / "w.safetensors", writer, "filter weights")


@pytest.mark.parametrize("env, args, words", [
    ({"WORLD_SIZE": "2", "RANK": "0"}, ["--tensor-parallel", "2"], ["MASTER_ADDR"]),
    ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"},
     ["--tensor-parallel", "2", "--model", "ideal"], ["no weights to shard"]),
    ({}, ["--dist-timeout", "inf"], ["--dist-timeout"]),
])
def test_misconfigured_distributed_launches_are_one_line(env, args, words):
    usage_error(invoke([*args, "--prompt", "sort : bob"], env=env), *words)


def test_every_integer_option_of_every_component_has_a_bound():
    """The class, not the examples: an integer field of any registered component (a count that can
    scale a step's work or memory) carries `fields.bounded`, so a new scheduler, cache, filter or
    decoder cannot take an unbounded count from a request."""
    import dataclasses
    import typing

    from dllm_decode.fields import scaling_fields

    unbounded = []
    for kind in HOMES:
        for name, cls in registry(kind).items():
            if not dataclasses.is_dataclass(cls):
                continue
            hints = typing.get_type_hints(cls)
            bounded_names = set(scaling_fields(cls))
            for field in dataclasses.fields(cls):
                if field.name == "seed":         # a seed scales nothing (its range is checked on its own)
                    continue
                hint = hints.get(field.name)
                ints = hint is int or int in typing.get_args(hint) and typing.get_origin(hint) is not tuple
                if ints and bool not in typing.get_args(hint) and hint is not bool \
                        and field.name not in bounded_names:
                    unbounded.append(f"{kind}:{name}.{field.name}")
    assert not unbounded, unbounded
