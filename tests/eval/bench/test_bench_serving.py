"""`bench serving` end to end on a small load: nothing lost, every answer as offline."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dllm_decode.cli import main

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")


def test_small_load_answers_everything_like_offline(tmp_path):
    out = tmp_path / "serving.json"
    result = CliRunner().invoke(main, ["bench", "serving", "--quick", "--requests", "6", "--clients", "3",
                                       "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    for phase in ("sequential", "concurrent"):
        p = report[phase]
        assert (p["answered"], p["failed"], p["lost"], p["different_from_offline"]) == (6, 0, 0, 0)
    assert (report["requests"], report["clients"], report["max_batch"]) == (6, 3, 4)   # given over --quick
    assert report["config"]["gen_length"] == 16
    assert report["throughput_ratio"] > 0 and "concurrent / sequential" in result.output
    offline = report["offline_requests_per_second"]
    assert report["server_over_offline"] == pytest.approx(offline / report["sequential"]["requests_per_second"],
                                                          rel=0.01)
    assert "server at concurrency 1 / offline" in result.output


def test_a_model_without_the_task_suite_is_refused():
    result = CliRunner().invoke(main, ["bench", "serving", "--model", "ideal"])
    assert result.exit_code == 2 and "not a masked diffusion LM" in result.output


def test_a_block_that_does_not_divide_the_canvas_is_refused():
    result = CliRunner().invoke(main, ["bench", "serving", "--gen-length", "12", "--block-length", "8"])
    assert result.exit_code == 2 and "must divide" in result.output and "--block-length" in result.output


def test_the_shipped_noise_model_is_served_under_load_like_offline(tmp_path):
    """The engine serves a uniform-noise model, so the load test takes `embedded-noise`: every
    answer through the server equals offline `generate`."""
    out = tmp_path / "serving.json"
    result = CliRunner().invoke(main, ["bench", "serving", "--model", "embedded-noise", "--quick",
                                       "--requests", "4", "--clients", "2", "--gen-length", "8",
                                       "--block-length", "8", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    for phase in ("sequential", "concurrent"):
        p = report[phase]
        assert (p["answered"], p["failed"], p["lost"], p["different_from_offline"]) == (4, 0, 0, 0)


def test_the_shared_prefix_workload_runs_the_noise_model_with_identical_answers(tmp_path):
    """`--workload shared-prefix --model embedded-noise`: its encoder's prompt K/V are reused
    (cached tokens counted), every answer with and without the prefix cache equals offline."""
    out = tmp_path / "shared.json"
    result = CliRunner().invoke(main, ["bench", "serving", "--workload", "shared-prefix", "--model", "embedded-noise",
                                       "--requests", "4", "--chats", "1", "--clients", "2", "--max-batch", "2",
                                       "--prefix-tokens", "64", "--gen-length", "16", "--repeats", "1",
                                       "--json", str(out)])
    assert result.exit_code == 0, (result.output, result.exception)
    report = json.loads(out.read_text())
    assert report["identical"] and report["config"]["scheduler"]["name"] == "uniform_noise"
    on = next(p for p in report["phases"] if p["prefix_cache"] == "on")
    assert on["cached_tokens"] >= 4 * 64 and 0 < on["store"]["resident_bytes"] <= report["prefix_cache_bytes"]
