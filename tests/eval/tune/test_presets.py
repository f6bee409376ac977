"""Presets by name: `--preset` on decode, batch (requests file), eval and serve, the API's
`preset_config`, and the server choosing a preset per request by task tag."""

from __future__ import annotations

import json
import pickle

import pytest
from click.testing import CliRunner

from dllm_decode.cli import main
from dllm_decode.config import DecodeConfig
from dllm_decode.eval.harness.presets import (PRESETS_ENV, find_preset, identity_of, preset_config,
                                              preset_setting, tuned_presets)
from dllm_decode.registry import component
from dllm_decode.serve.protocol import APIError, Settings, extension, parse_job
from dllm_decode.testing import tiny_tokenizer


def tuned_file(tmp_path, model=None):
    """A presets.json as `dllm-decode tune` writes it (two tasks and `overall`)."""
    model = model or {"name": "ideal:noise=0.01"}
    entry = lambda t: {"parts": {"scheduler": {"name": "threshold", "threshold": t}, "cache": {"name": "none"},
                                 "filters": [], "block_length": 8}}
    path = tmp_path / "presets.json"
    path.write_text(json.dumps({"model": model, "budget": "within:5",
                                "presets": {"copy": entry(0.5), "shuffle": entry(0.95), "overall": entry(0.9)}}))
    return path


def test_find_preset_by_file_file_name_and_environment(tmp_path, monkeypatch):
    path = tuned_file(tmp_path)
    ideal = {"name": "ideal:noise=0.01"}
    assert find_preset(str(path), ideal).parts["scheduler"]["threshold"] == 0.9           # FILE: overall
    assert find_preset(f"{path}:copy", ideal).parts["scheduler"]["threshold"] == 0.5
    monkeypatch.setenv(PRESETS_ENV, str(path))
    assert find_preset("shuffle", ideal).parts["scheduler"]["threshold"] == 0.95          # NAME via the env
    assert find_preset("eb_eotp").parts["scheduler"]["name"] == "eb"                      # hand-written
    config = preset_config(f"{path}:copy", ideal, gen_length=16)
    assert config.scheduler.threshold == 0.5 and config.block_length == 8


@pytest.mark.parametrize("content, message", [
    (b"not json", "not JSON"),
    (pickle.dumps({"presets": {}}), "not JSON"),                                          # never unpickled
    (b'{"presets": {}}', "no `presets` object"),
    (b'{"presets": {"copy": {"parts": {}}}}', "has no `parts` with a scheduler"),
])
def test_malformed_files_are_refused_in_one_line(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message) as err:
        find_preset(f"{path}:copy")
    assert "\n" not in str(err.value)


def test_unknown_names_and_other_models_are_refused(tmp_path, monkeypatch):
    path = tuned_file(tmp_path)
    monkeypatch.delenv(PRESETS_ENV, raising=False)
    with pytest.raises(ValueError, match="unknown preset 'fast'.*DLLM_DECODE_PRESETS"):
        find_preset("fast")
    with pytest.raises(ValueError, match="has no preset 'sort'; it has copy, overall, shuffle"):
        find_preset(f"{path}:sort")
    with pytest.raises(ValueError, match="does not exist or is not a regular file"):
        find_preset(f"{tmp_path}:copy")
    with pytest.raises(ValueError, match="was tuned on ideal:noise=0.01, not embedded"):
        find_preset(f"{path}:copy", {"name": "embedded"})
    hashed = tuned_file(tmp_path, {"name": "embedded", "weights_sha256": "00"})
    with pytest.raises(ValueError, match="tuned on another model"):
        tuned_presets(hashed, identity_of(type("Spec", (), {"kind": "diffusion", "name": "embedded",
                                                           "__str__": lambda self: "embedded"})()))


def test_decode_and_a_requests_file_take_a_preset(tmp_path):
    path = tuned_file(tmp_path, {"name": "tiny"})
    runner = CliRunner()
    result = runner.invoke(main, ["--model", "tiny", "--prompt", "w1 w2", "--gen-length", "8",
                                  "--preset", f"{path}:copy", "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.output.strip().splitlines()[-1])
    assert record["config"]["scheduler"]["threshold"] == 0.5 and record["config"]["block_length"] == 8
    clash = runner.invoke(main, ["--model", "tiny", "--prompt", "w1", "--preset", str(path), "--cache", "prefix"])
    assert clash.exit_code == 2 and "--preset fixes the scheduler, cache and filters; drop --cache" in clash.output
    other = runner.invoke(main, ["--model", "ideal", "--prompt", "x", "--preset", f"{path}:copy"])
    assert other.exit_code == 2 and "tuned on tiny, not ideal" in other.output and "Traceback" not in other.output
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    requests.write_text(json.dumps({"id": "a", "prompt": "w1 w2"}) + "\n")
    batch = runner.invoke(main, ["--model", "tiny", "--gen-length", "8", "--preset", f"{path}:shuffle",
                                 "--input", str(requests), "--output", str(out)])
    assert batch.exit_code == 0, batch.output
    assert json.loads(out.read_text().splitlines()[0])["config"]["scheduler"]["threshold"] == 0.95


def test_eval_runs_presets_as_points(tmp_path):
    path = tuned_file(tmp_path)
    result = CliRunner().invoke(main, ["eval", "--model", "ideal:noise=0.01", "--tasks", "copy", "--limit", "2",
                                       "--gen-length", "answer", "--preset", f"{path}:copy", "--preset", str(path),
                                       "--out", str(tmp_path / "run"), "--no-plots", "--no-progress", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert sorted(e["label"] for e in summary["leaderboard"]) == ["threshold threshold=0.5", "threshold threshold=0.9"]
    setting = preset_setting(find_preset(f"{path}:copy"), gen_length=256, block_length=None)
    assert setting.block_length == 8 and dict(setting.options) == {"threshold": "0.5"}


def test_the_server_picks_a_preset_by_task_tag():
    base = DecodeConfig(scheduler=component("scheduler", {"name": "threshold", "threshold": 0.8}),
                        gen_length=64, block_length=16)
    shuffle = DecodeConfig(scheduler=component("scheduler", {"name": "threshold", "threshold": 0.95}),
                           gen_length=64, block_length=8)
    settings = Settings(model_id="m", config=base, max_tokens=256, presets={"shuffle": shuffle})
    tok = tiny_tokenizer()
    plain = parse_job("completion", {"prompt": "w1"}, settings, tok)
    assert plain.config.scheduler.threshold == 0.8 and plain.preset is None
    tagged = parse_job("completion", {"prompt": "w1", "model": "m:shuffle"}, settings, tok)
    assert tagged.config.scheduler.threshold == 0.95 and tagged.config.block_length == 8
    named = parse_job("completion", {"prompt": "w1", "dllm": {"preset": "shuffle", "block_length": 16}}, settings, tok)
    assert named.preset == "shuffle" and named.config.block_length == 16          # the request's own options win
    for body, status, param in [({"dllm": {"preset": "sort"}}, 400, "dllm.preset"),
                                ({"model": "m:sort"}, 400, "model"),
                                ({"model": "other:shuffle"}, 404, "model"),
                                ({"dllm": {"preset": "../presets.json"}}, 400, "dllm.preset"),
                                ({"model": "m:shuffle", "dllm": {"preset": "copy"}}, 400, "dllm.preset")]:
        with pytest.raises(APIError) as err:
            parse_job("completion", {"prompt": "w1", **body}, settings, tok)
        assert (err.value.status, err.value.param) == (status, param)
    class Out:
        nfe, seconds, queued = 3, 0.1, 0.0
    assert extension(tagged, Out())["preset"] == "shuffle" and "preset" not in extension(plain, Out())


def test_a_served_preset_keeps_its_scheduler_where_the_server_names_none(tmp_path, embedded):
    """The model's shipped decoding fills in only the command's own record: a server started
    without --scheduler serves each preset with the preset's rule, not the shipped one."""
    from dllm_decode.cli.serve import _request_presets, serve_command
    from dllm_decode.modelspec import ModelSpec

    path = tuned_file(tmp_path, {"name": "embedded"})
    config = DecodeConfig(component("scheduler", "threshold"), gen_length=32, block_length=32)
    with serve_command.make_context("serve", ["--model", "embedded", "--presets", str(path)]):
        presets = _request_presets(str(path), ModelSpec.parse("embedded"), config, embedded)
    assert presets["copy"].scheduler.threshold == 0.5 and presets["shuffle"].scheduler.threshold == 0.95
