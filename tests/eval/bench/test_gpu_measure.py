"""The prepared device script: its JSON, its budget, its stages, on the CPU with `--quick`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dllm_decode.eval.bench.device import (STAGE_COST, DeviceOptions, command_line, run_device, shaped_stages, slug,
                                           targets)

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "gpu_measure.py"
BLOCK = """
import runpy, sys
# absent as a missing package is: `import X` fails and importlib.util.find_spec("X") is None
# (torch probes optional packages that way)
for name in ("click", "transformers", "tokenizers", "huggingface_hub", "pydantic", "tqdm", "fastapi", "uvicorn"):
    sys.modules[name] = None
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__ + repr(f)]   # not installed
for name in [m for m in sys.modules if m == "dllm_decode" or m.startswith("dllm_decode.")]:
    del sys.modules[name]
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def report_of(root: Path) -> dict:
    found = list(root.glob("measurements/cpu_*/gpu_measure_quick.json"))
    assert len(found) == 1, found
    return json.loads(found[0].read_text())


def test_json_names_device_versions_commit_and_commands(tmp_path, one_thread):
    report, path = run_device(DeviceOptions(device="cpu", quick=True, root=str(tmp_path), commit="abc123",
                                            stages=("sanity", "engine")), lambda line: None)
    assert path.parent.name.startswith("cpu_") and path.parent.parent.name == "measurements"
    assert json.loads(path.read_text()) == json.loads(json.dumps(report, default=str))
    env = report["environment"]
    assert env["device"] == "cpu" and env["torch"] and env["commit"] == "abc123" and "driver" in env
    assert env["peaks"] == "unknown device"
    assert set(report["commands"]) == {"sanity", "engine"} and not report["failed"]
    engine = report["stages"]["engine"]
    for phase in ("queued", "arriving"):
        assert engine[phase]["requests"] == engine["requests"] and engine[phase]["tokens_per_second"] > 0
    assert engine["arriving"]["engine_steps"] >= engine["queued"]["engine_steps"]
    sanity = report["stages"]["sanity"]
    assert sanity["available"] is False and sanity["note"].startswith("not available") or \
        sanity["sync_check"] == "not run (CUDA only)"
    assert set(report["targets"]) >= {"batch1_captured_x_read_floor", "vs_fast_dllm_v1"}


def test_budget_skips_stages_and_says_so(tmp_path):
    report, _ = run_device(DeviceOptions(device="cpu", quick=True, root=str(tmp_path), budget=0.01),
                           lambda line: None)
    assert set(report["skipped"]) == set(STAGE_COST) and not report["stages"]
    assert all(text.startswith("budget") for text in report["skipped"].values())


def test_stage_commands_rerun_the_stage_on_their_own():
    stages = shaped_stages(DeviceOptions(device="cuda", peers=(("fast-dllm", "/ck"),)))
    assert stages["batch1"]["shape"] == "llada-8b" and stages["batch1"]["dtype"] == "bfloat16"
    assert stages["large_batch"]["batch_sizes"] == (32, 64) and stages["block"]["caches"] == ("block",)
    line = command_line(DeviceOptions(), stages["batch1"])
    assert line.startswith("dllm-decode bench shaped --shape llada-8b --device cuda")
    for words in ("--batch 1", "--cache dual", "--step captured", "--runtime compact", "--peer fast-dllm=/ck",
                  "--prompt-length 64", "--steps-per-block 2", "--prompts 4"):
        assert words in line
    assert slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"


def test_targets_read_off_the_rows():
    row = dict(available=True, runtime="compact", cache="dual", batch=1, ms_per_forward=6.0, read_floor_ms=4.5,
               vs_eager=2.5, overhead=0.01)
    report = {"stages": {"batch1": {"rows": [dict(row, variant="captured"), dict(row, variant="eager", vs_eager=None),
                                             dict(available=True, runtime="peer:fast-dllm-v1@abc", ours_speedup=1.7,
                                                  ours_best="compact captured", identical_tokens=True, commit="abc",
                                                  cache="dual", batch=1, variant="eager")]}}}
    got = targets(report)
    assert got["batch1_captured_x_read_floor"] == pytest.approx(6.0 / 4.5)
    assert got["batch1_captured_vs_eager"] == 2.5 and got["vs_fast_dllm_v1"]["ours_speedup"] == 1.7


@pytest.mark.parametrize("args, fragment", [(["--budget", "-1"], "budget"), (["--peer", "x"], "NAME=PATH")])
def test_bad_arguments_are_one_line(args, fragment, tmp_path):
    from dllm_decode.eval.bench.device import main

    with pytest.raises(SystemExit) as exit_:
        main(["--quick", "--root", str(tmp_path), *args])
    assert exit_.value.code == 2


@pytest.mark.slow
def test_quick_script_runs_every_stage_with_torch_only_under_a_minute(tmp_path):
    """The script from a checkout, the package not installed and the packages the device machine
    may lack blocked (torch, einops and safetensors only): every stage runs (or is skipped for a stated reason) on the CPU in under ~60 s."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", BLOCK, str(SCRIPT), "--quick", "--root", str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "editable" not in done.stderr
    report = report_of(tmp_path)
    assert set(report["stages"]) | set(report["skipped"]) == set(STAGE_COST) and not report["failed"]
    assert report["skipped"] == {"block_peer": "no --peer given"}
    assert report["elapsed_seconds"] < 60 and time.perf_counter() - started < 120
    for stage in ("batch1", "large_batch", "block"):
        assert any(r["available"] for r in report["stages"][stage]["rows"]) and report["tables"][stage]


UNINSTALLED_PYTEST = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__ + repr(f)]   # not installed
import pytest
import torch
sys.exit(pytest.main(["--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider", "tests/test_gpu.py"]))
"""


def test_gpu_tests_collect_from_an_uninstalled_checkout():
    """The device machine runs the GPU tests from a copied checkout with no install: the root
    folders resolve as `dllm_decode.eval` and the rest (tests/conftest.py)."""
    done = subprocess.run([sys.executable, "-c", UNINSTALLED_PYTEST], capture_output=True, text=True,
                          cwd=REPO, timeout=300, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "tests/test_gpu.py::test_cuda_graph_replay_equals_eager_tokens" in done.stdout


def test_cached_step_is_read_against_its_own_floor():
    """The target reads the shortest replay (the dual cache's block-only step) over that one
    step's weight-read floor, not a decode's average forward over the average floor."""
    from dllm_decode.devices import DEVICE_PEAKS
    from dllm_decode.eval.bench.device import cached_step_floor
    from dllm_decode.eval.bench.roofline import Forward, ModelShape, floor
    from dllm_decode.eval.bench.shaped import ShapedOptions, shaped_model

    options = ShapedOptions(shape="embedded", layers=1, prompt_length=8, gen_length=16, block_length=8)
    model = shaped_model(options)
    peaks = next(iter(DEVICE_PEAKS.values()))
    out = cached_step_floor(model, options, {"refresh": 9.0, "step": 2.0}, peaks)["cached_step"]
    one = floor(ModelShape.of(model), [Forward(8, 8, 24)], 1, peaks, options.dtype)
    assert out["bucket"] == "step" and out["replay_ms"] == 2.0
    assert out["read_floor_ms"] == pytest.approx(1000 * one.read_seconds)
    assert out["x_read_floor"] == pytest.approx(2.0 / out["read_floor_ms"])


def test_low_precision_stage_times_each_format_against_its_own_floor(one_thread):
    """The stage runs every format's layers and a model step (a format a shape cannot take is a
    note, not a failure), quantized weights are smaller, and the target reads the step ratios."""
    from dllm_decode.eval.bench.device import low_precision, targets

    out = low_precision(DeviceOptions(device="cpu", quick=True))
    steps = {(r["format"], r.get("batch")): r for r in out["steps"]}
    assert steps[("int8", 1)]["weight_bytes"] < 0.6 * steps[("bf16", 1)]["weight_bytes"]
    assert {r["format"] for r in out["layers"] if "ms" in r} >= {"bf16", "int8", "fp8"}
    ratios = targets({"stages": {"low_precision": out}})["low_precision_step_vs_bf16_batch1"]
    assert set(ratios) >= {"int8", "fp8"} and all(v > 0 for v in ratios.values())


def test_invariance_stage_reports_every_option_and_float32_on_the_cpu_is_invariant(one_thread):
    """The quick stage (float32 on the CPU, random-weight and shipped models, every option): one
    row per model, cache and option with each plan's differing fractions and the step time against
    the default's; in float32 on the CPU no request's tokens move (the known result), so every
    option is listed as restoring invariance."""
    from dllm_decode.eval.bench.device import invariance_options
    from dllm_decode.eval.bench.invariance import OPTIONS, PLANS, format_invariance, run_invariance

    report = run_invariance(invariance_options(DeviceOptions(device="cpu", quick=True)))
    assert report["dtype"] == "float32" and not report["notes"]
    keys = {(r["model"], r["cache"]) for r in report["rows"]}
    assert {cache for _, cache in keys} == {"none", "dual", "block"} and len(keys) == 6
    for row in report["rows"]:
        assert set(row["plans"]) == set(PLANS)
        for plan in row["plans"].values():
            assert plan["requests"] == 3 and plan["tokens"] > 0
            assert plan["differing_requests"] == 0 or plan.get("known_variant"), row
        assert row["differing_requests"] == 0 and row["differing_tokens"] == 0
        assert row["ms_per_step"] > 0 and row["x_default"] > 0
    assert all(r["x_default"] == 1 for r in report["rows"] if r["option"] == "default")
    assert all(options == list(OPTIONS) for options in report["restores"].values()) and len(report["restores"]) == 6
    assert len(format_invariance(report).splitlines()) == len(report["rows"]) + 3
    got = targets({"stages": {"invariance": report}})
    assert set(got["invariance_differing_requests_default"].values()) == {0.0}


def test_a_difference_counts_requests_and_tokens():
    from dllm_decode.eval.bench.invariance import difference, plans

    alone = {0: [1, 2, 3, 4], 1: [5, 6], 2: [7, 8, 9]}
    got = difference({0: [1, 2, 3, 4], 1: [5, 0], 2: [7, 8]}, alone)
    assert got["differing_requests"] == pytest.approx(2 / 3) and got["which"] == [1, 2]
    assert got["tokens"] == 9 and got["differing_tokens"] == pytest.approx(2 / 9)
    joining = plans(4)["joining"]
    assert [i for i, _ in joining] == [3, 2, 1, 0] and [s for _, s in joining] == [0, 0, 1, 2]


def test_fixed_shape_matmul_issues_one_gemm_height_for_every_linear_layer(one_thread):
    """Under the option every mm/addmm of a model's forward (its linear layers, with and without
    bias) runs in tiles of one height, and the result equals the plain forward within float32
    rounding."""
    from torch import nn

    from dllm_decode.eval.bench.invariance import FixedShapeMatmul
    from dllm_decode.eval.bench.shaped import ShapedOptions, shaped_model

    torch.manual_seed(0)
    for layer in (nn.Linear(12, 5), nn.Linear(12, 5, bias=False)):
        x = torch.randn(3, 7, 12)
        with FixedShapeMatmul(tile=4) as mode:
            tiled = layer(x)
        assert mode.calls == 1 and mode.heights == {4}
        torch.testing.assert_close(tiled, layer(x), rtol=1e-6, atol=1e-6)
    model = shaped_model(ShapedOptions(shape="embedded", layers=1, dtype="float32"))
    ids = torch.randint(5, 100, (2, 9))
    with torch.inference_mode(), FixedShapeMatmul(tile=8) as mode:
        tiled = model(ids)
    assert mode.calls >= 5 and mode.heights == {8}          # q, k, v, o, the MLP and the head at least
    with torch.inference_mode():
        torch.testing.assert_close(tiled, model(ids), rtol=1e-5, atol=1e-5)
