"""The one prepared device measurement: every GPU figure of the captured-step work in one call.

    python scripts/gpu_measure.py [--budget 420] [--peer fast-dllm=PATH] [--root DIR] [--quick]
    dllm-decode bench device [...]              (the same run)

Stages, in order, each a `bench shaped` run (`dllm_decode.eval.bench.shaped`) on random weights
of a real model's shape (no download, no checkpoint), or a check:

1. `environment`: device, torch, CUDA and driver versions, the commit, the peaks the floors use.
2. `batch1`: LLaDA-8B shape, bf16, batch 1, caches none and dual, the reference and compact
   runtimes eager, the compact one captured, Fast-dLLM v1's dual-cache loop beside them (with
   `--peer`): the step against its weight-read floor, captured against eager, loop overhead.
3. `sanity`: one captured decode with `torch.cuda.set_sync_debug_mode("error")` around every graph
   replay (a replay that syncs with the host fails the check), the graph pool's memory, the
   device's peak memory, the loop overhead of a captured decode from replay-timed steps, and the
   **cached step's replay time against its own weight-read floor** (the dual cache's block-only
   step, not a decode's average forward, half of which are full-canvas refreshes).
4. `identity`: float32 at the shape's width (4 layers): the captured step's tokens equal eager's
   exactly (bf16 rows report agreement as a fraction: random weights have near-ties).
4b. `invariance`: batch invariance in bf16 (`dllm_decode.eval.bench.invariance`): prompts of
   different lengths decoded alone, together, in another order and joining a running `Engine`, at
   the shape's width (8 layers; caches none, dual, block) and on the shipped trained models, under
   torch's defaults and each option that may restore invariance, with each option's step time.
5. `block`: the block-diffusion model of the shape (Fast-dLLM v2 7B, grouped-query attention)
   under the block cache: the per-step captured path, batch 1 and 32, eager and captured.
6. `low_precision`: weight-only int8, int4 (group 128) and FP8 linear layers
   (`dllm_decode.quant.QuantLinear`) against bf16 at LLaDA-8B's projection shapes and an MoE
   expert's, 1 and 32 rows, and a 4-layer LLaDA-8B-width step: ms per call and x each format's
   own weight-read floor (its bytes, scales included, over the memory bandwidth).
6b. `large_batch`: batch 32 and 64, compact, none and dual, eager and captured.
7. `engine`: the serving engine under load on the device: requests queued at once and arriving
   one per step, continuous batching up to its max batch (`dllm_decode.engine.Engine`).
8. `block_peer`: Fast-dLLM v2's `batch_sample` beside this project's block loop at one token per
   step (the only fixed-count policy it has), batch 1 (with `--peer`).

A time budget (`--budget` seconds, default 420 so the whole call stays under 8 minutes with room
for the models' construction) is checked before each stage: a stage whose usual cost exceeds
what is left is skipped and the JSON says so. The JSON is rewritten (atomically) after every
stage, so a run cut short keeps what it measured. `--quick` runs every stage on the CPU at the
embedded shape in well under a minute (the script's own test).
"""

from __future__ import annotations

import datetime
import json
import platform
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class DeviceOptions:
    """What the device run does.

    Attributes:
        device: where to run (`cuda` on the GPU machine, `cpu` for `--quick`).
        quick: the embedded shape, tiny lengths, one repeat: a CPU smoke run of every stage.
        budget: seconds the stages may take (the environment and the JSON not counted).
        peers: (name, checkout path) pairs (`bench shaped --peer`).
        root: the folder `measurements/<device>_<date>/` is made under.
        commit: the measured commit (None: read with git; the device's copy may have no .git).
        stages: the stages to run (None: all).
    """

    device: str = "cuda"
    quick: bool = False
    budget: float = 420.0
    peers: tuple[tuple[str, str], ...] = ()
    root: str = "."
    commit: str | None = None
    stages: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.budget <= 0:
            raise ValueError(f"budget must be > 0 seconds, got {self.budget}")
        unknown = set(self.stages or ()) - set(STAGE_COST)
        if unknown:
            raise ValueError(f"unknown stage(s) {sorted(unknown)}; choose from {list(STAGE_COST)}")


STAGE_COST = {"batch1": 60.0, "sanity": 20.0, "identity": 20.0, "invariance": 60.0, "block": 90.0,
              "low_precision": 40.0, "large_batch": 150.0, "engine": 40.0, "block_peer": 45.0}
"""Each stage's expected seconds on one H100 (from the 2026-11-26 run's rates; `invariance` and
`low_precision` are guesses, never run), in the order they run (most wanted first; `invariance`, with
no GPU figure yet, before the long timing stages); a stage starts only when the
budget left covers it. `--quick` scales them down 100x."""


def slug(text: str) -> str:
    """`NVIDIA H100 80GB HBM3` -> `nvidia-h100-80gb-hbm3`."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "device"


def environment(device: torch.device, commit: str | None) -> dict[str, Any]:
    """Device, torch, CUDA and driver versions, commit, Python and the peaks the floors use."""
    from dllm_decode.devices import device_name, device_peaks
    from dllm_decode.eval.bench.roofline import UNKNOWN_DEVICE

    name = device_name(device)
    peaks = device_peaks(name)
    info: dict[str, Any] = {
        "device": name, "torch": torch.__version__, "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None),
        "driver": _driver(), "python": platform.python_version(), "platform": platform.platform(),
        "commit": commit or _git("rev-parse", "HEAD") or "unknown (no git here; pass --commit)",
        "dirty": bool(_git("status", "--porcelain")) if _git("rev-parse", "HEAD") else None,
        "peaks": peaks.__dict__ if peaks else UNKNOWN_DEVICE,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(memory_bytes=props.total_memory, multiprocessors=props.multi_processor_count,
                    capability=f"{props.major}.{props.minor}")
    return info


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _driver() -> str | None:
    """The NVIDIA driver version (nvidia-smi), else None."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None


def shaped_stages(o: DeviceOptions) -> dict[str, dict[str, Any]]:
    """Each `bench shaped` stage's settings (the `ShapedOptions` fields), full size or `--quick`."""
    base = dict(shape="llada-8b", device=o.device, dtype="bfloat16", prompt_length=64, gen_length=256,
                block_length=32, steps_per_block=2)
    if o.quick:
        base.update(shape="embedded", prompt_length=8, gen_length=32, block_length=16)
    peers = tuple(o.peers)
    b_large = (2, 4) if o.quick else (32, 64)
    return {
        "batch1": dict(base, batch_sizes=(1,), caches=("none", "dual"), runtimes=("reference", "compact"),
                       variants=("eager", "captured"), repeats=1 if o.quick else 3, prompts=2 if o.quick else 4,
                       peers=peers),
        "large_batch": dict(base, batch_sizes=b_large, caches=("none", "dual"), runtimes=("compact",),
                            variants=("eager", "captured"), repeats=1, prompts=max(b_large)),
        "block": dict(base, batch_sizes=(1, b_large[0]), caches=("block",), runtimes=("compact",),
                      variants=("eager", "captured"), repeats=1, prompts=b_large[0]),
        "block_peer": dict(base, batch_sizes=(1,), caches=("block",), runtimes=("compact",), variants=("eager",),
                           repeats=1, prompts=2, steps_per_block=base["block_length"], peers=peers),
        "identity": dict(base, dtype="float32", layers=4, batch_sizes=(1,), caches=("none", "dual"),
                         runtimes=("compact",), variants=("eager", "captured"), repeats=1, prompts=2),
    }


def command_line(o: DeviceOptions, settings: dict[str, Any]) -> str:
    """The `dllm-decode bench shaped` command that reruns one stage on its own."""
    words = ["dllm-decode", "bench", "shaped"]
    flags = {"shape": "--shape", "device": "--device", "dtype": "--dtype", "prompt_length": "--prompt-length",
             "gen_length": "--gen-length", "block_length": "--block-length", "steps_per_block": "--steps-per-block",
             "repeats": "--repeats", "prompts": "--prompts"}
    for key, flag in flags.items():
        if flag and key in settings:
            words += [flag, str(settings[key])]
    for key, flag in (("batch_sizes", "--batch"), ("caches", "--cache"), ("runtimes", "--runtime"),
                      ("variants", "--step")):
        for value in settings.get(key, ()):
            words += [flag, str(value)]
    for name, path in settings.get("peers", ()):
        words += ["--peer", f"{name}={path}"]
    return shlex.join(words)


def invariance_options(o: DeviceOptions) -> Any:
    """The `invariance` stage's settings: bf16 at LLaDA-8B's width (8 layers) on the device; with
    `--quick`, float32 at the embedded shape with tiles small enough to split its rows."""
    from dllm_decode.eval.bench.invariance import InvarianceOptions

    if o.quick:
        return InvarianceOptions(device=o.device, dtype="float32", shape="embedded", layers=2, prompt_lengths=(6, 3, 5),
                                 gen_length=8, block_length=4, steps_per_block=2, tile=16, repeats=1)
    return InvarianceOptions(device=o.device)


def sanity(o: DeviceOptions) -> dict[str, Any]:
    """One captured decode with the sync debug mode set to `error` around every whole captured
    call (`GraphCache.strict`), and the graph pool's and the device's memory."""
    from dllm_decode import DecodeConfig
    from dllm_decode.caches import DualCache
    from dllm_decode.eval.bench.captured import captured_decoder
    from dllm_decode.eval.bench.forward import runtime_view
    from dllm_decode.eval.bench.shaped import ShapedOptions, prompts_for, shaped_model
    from dllm_decode.schedulers import LowConfidenceScheduler

    settings = shaped_stages(o)["batch1"]
    options = ShapedOptions(**{k: v for k, v in settings.items() if k != "peers"})
    model = runtime_view(shaped_model(options), "compact")
    config = DecodeConfig(scheduler=LowConfidenceScheduler(steps_per_block=options.steps_per_block),
                          cache=DualCache(), gen_length=options.gen_length, block_length=options.block_length,
                          stop_at_eos=False)
    decode, missing, graphs = captured_decoder(model, config, None, options.capture, 1)
    if decode is None:
        return {"available": False, "note": missing}
    prompt = prompts_for(model, options, 1)
    decode(prompt)                                         # records every bucket this decode uses
    cuda = torch.device(o.device).type == "cuda"
    if not (hasattr(graphs, "run") and hasattr(graphs, "entries")):
        return {"available": True, "mode": getattr(graphs, "mode", None),
                "sync_check": "not run: the graph cache has no per-bucket run() to wrap"}
    checked = [0]
    run = graphs.run

    def counted(key: tuple, owner: tuple, args: tuple, **more: Any) -> Any:
        checked[0] += key in graphs.entries
        return run(key, owner, args, **more)

    graphs.run = counted
    graphs.strict = cuda          # the whole captured call (loads, writes, run, slices) may not sync
    error = None
    try:
        decode(prompt)
    except RuntimeError as err:
        error = str(err).splitlines()[0]
    finally:
        del graphs.run
        graphs.strict = False
    out = {"available": True, "mode": graphs.mode, "captures": graphs.captures, "pool_bytes": graphs.pool_bytes,
           "buckets": [repr(key) for key in graphs.entries], "replays_checked": checked[0],
           "sync_in_replay": error,
           "sync_check": "passed" if cuda and error is None and checked[0] else
                         ("FAILED" if error else "not run (CUDA only)")}
    if cuda and error is None:
        out.update(replay_overhead(graphs, decode, prompt))
        out.update(cached_step_floor(model, options, out["replay_ms"]))
    if cuda:
        out.update(max_allocated_bytes=torch.cuda.max_memory_allocated(), reserved_bytes=torch.cuda.memory_reserved())
    return out


def replay_overhead(graphs: Any, decode: Callable[[list[list[int]]], Any], prompt: list[list[int]],
                    replays: int = 20) -> dict[str, Any]:
    """Loop overhead of a captured decode at batch 1: one decode timed with the step calls
    counted per bucket, then each bucket's graph replayed back to back (device time per step,
    no host work between); overhead = 1 - sum(calls x replay time) / decode time."""
    calls: dict[tuple, int] = {}
    run = graphs.run

    def counting(key: tuple, owner: tuple, args: tuple, **more: Any) -> Any:
        calls[key] = calls.get(key, 0) + 1
        return run(key, owner, args, **more)

    graphs.run = counting
    try:
        torch.cuda.synchronize()
        started = time.perf_counter()
        decode(prompt)
        torch.cuda.synchronize()
        wall = time.perf_counter() - started
    finally:
        del graphs.run
    replay_ms = {}
    for key in calls:
        replay = graphs.entries[key][1]
        replay()
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(replays):
            replay()
        torch.cuda.synchronize()
        replay_ms[repr(key)] = 1000 * (time.perf_counter() - started) / replays
    device_seconds = sum(calls[key] * replay_ms[repr(key)] / 1000 for key in calls)
    return {"decode_seconds": wall, "steps": sum(calls.values()), "replay_ms": replay_ms,
            "loop_overhead": 1 - device_seconds / wall if wall > 0 else None}


def cached_step_floor(model: Any, options: Any, replay_ms: dict[str, float], peaks: Any = None) -> dict[str, Any]:
    """The dual cache's cached step (the block's rows fed, every key attended: the step a decode
    repeats between refreshes) replayed alone, against its own weight-read floor. Its bucket is
    the one with the shortest replay (a refresh feeds the whole canvas)."""
    from dllm_decode.devices import device_name, device_peaks
    from dllm_decode.eval.bench.roofline import Forward, ModelShape, floor

    if not replay_ms:
        return {"cached_step": None}
    device = next(model.parameters()).device
    total = options.prompt_length + options.gen_length
    step = Forward(options.block_length, options.block_length, total)
    peaks = peaks or device_peaks(device_name(device))
    bound = floor(ModelShape.of(model), [step], 1, peaks, options.dtype)
    bucket = min(replay_ms, key=replay_ms.get)
    read_ms = 1000 * bound.read_seconds if bound else None
    return {"cached_step": {"bucket": bucket, "replay_ms": replay_ms[bucket], "read_floor_ms": read_ms,
                            "floor_ms": bound.ms_per_forward if bound else None,
                            "x_read_floor": replay_ms[bucket] / read_ms if read_ms else None}}


LOW_PRECISION_SHAPES = {"llada-8b q/o": (4096, 4096), "llada-8b up": (4096, 12288),
                        "llada-8b down": (12288, 4096), "moe expert up": (2048, 1408),
                        "moe expert down": (1408, 2048)}
"""(in, out) features of the layers the low-precision stage times: LLaDA-8B's projections and an
MoE expert of the LLaDA2-mini class (2048 wide, 1408 per expert)."""


def low_precision(o: DeviceOptions, formats: tuple[str, ...] = ("bf16", "int8", "int4:128", "fp8"),
                  calls: int = 50) -> dict[str, Any]:
    """Each format's linear layers and a short LLaDA-8B-width model step, timed on the device
    against its own weight-read floor (`QuantLinear`'s kernels where this build has them, its
    dequantizing fallback elsewhere: the stage sizes the gap either way)."""
    from torch import nn

    from dllm_decode.devices import device_name, device_peaks
    from dllm_decode.quant import QuantLinear, quantize_model, weight_bytes

    device = torch.device(o.device)
    peaks = device_peaks(device_name(device))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    shapes = {"tiny": (64, 96)} if o.quick else LOW_PRECISION_SHAPES
    rows, calls = ((1, 4), 2) if o.quick else ((1, 32), calls)

    def timed(fn: Callable[[], Any]) -> float:
        fn()
        sync()
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        return 1000 * (time.perf_counter() - started) / calls

    def floor_ms(module: Any) -> float | None:
        return 1000 * weight_bytes(module) / peaks.hbm_bytes_per_s if peaks else None

    out: dict[str, Any] = {"layers": [], "steps": [], "calls": calls}
    torch.manual_seed(0)
    for name, (fan_in, fan_out) in shapes.items():
        base = nn.Linear(fan_in, fan_out, bias=False, device=device, dtype=torch.bfloat16)
        for fmt in formats:
            try:
                layer = base if fmt == "bf16" else QuantLinear.from_linear(base, *_format(fmt))
            except (ValueError, RuntimeError) as err:
                out["layers"].append({"shape": name, "format": fmt, "note": str(err).splitlines()[0]})
                continue
            for n in rows:
                x = torch.randn(n, fan_in, device=device, dtype=torch.bfloat16)
                ms, bound = timed(lambda: layer(x)), floor_ms(layer)
                out["layers"].append({"shape": name, "format": fmt, "rows": n, "ms": ms, "read_floor_ms": bound,
                                      "x_read_floor": ms / bound if bound else None})
    from dllm_decode.eval.bench.shaped import ShapedOptions, shaped_model

    options = ShapedOptions(shape="embedded" if o.quick else "llada-8b", layers=2 if o.quick else 4,
                            device=o.device, dtype="bfloat16")
    for fmt in formats:
        model = shaped_model(options)
        try:
            if fmt != "bf16":
                quantize_model(model, *_format(fmt))
        except (ValueError, RuntimeError) as err:
            out["steps"].append({"format": fmt, "note": str(err).splitlines()[0]})
            continue
        for batch in rows:
            ids = torch.randint(5, 100, (batch, 32 if o.quick else 288), device=device)
            with torch.inference_mode():
                ms = timed(lambda: model(ids))
            bound = floor_ms(model)
            out["steps"].append({"format": fmt, "batch": batch, "layers": options.layers, "ms": ms,
                                 "weight_bytes": weight_bytes(model), "read_floor_ms": bound,
                                 "x_read_floor": ms / bound if bound else None})
        del model
    return out


def _step_ratios(stage: dict[str, Any]) -> dict[str, float] | None:
    """Each format's batch-1 step time over bf16's (the FP8 target: <= 0.6x)."""
    steps = {r["format"]: r["ms"] for r in stage.get("steps", []) if r.get("batch") == 1}
    if "bf16" not in steps:
        return None
    return {fmt: ms / steps["bf16"] for fmt, ms in steps.items() if fmt != "bf16"}


def _format(text: str) -> tuple[str, ...]:
    """`int4:128` -> ("int4", 128); `int8` -> ("int8",)."""
    name, _, group = text.partition(":")
    return (name, int(group)) if group else (name,)


def engine_load(o: DeviceOptions) -> dict[str, Any]:
    """The serving engine on the device: `requests` prompts queued at once, then arriving one per
    step, continuous batching up to `max_batch` rows (dual cache, the benchmark's fixed-count
    policy); tokens/s, engine steps and request latency."""
    from dllm_decode import DecodeConfig
    from dllm_decode.caches import DualCache
    from dllm_decode.devices import device_sync
    from dllm_decode.engine import Engine
    from dllm_decode.eval.bench.forward import runtime_view
    from dllm_decode.eval.bench.shaped import ShapedOptions, prompts_for, shaped_model
    from dllm_decode.schedulers import LowConfidenceScheduler
    from dllm_decode.serving import Request

    settings = shaped_stages(o)["batch1"]
    options = ShapedOptions(**{k: v for k, v in settings.items() if k not in ("peers", "prompts")})
    requests, max_batch = (6, 4) if o.quick else (64, 32)
    model = runtime_view(shaped_model(options), "compact")
    config = DecodeConfig(scheduler=LowConfidenceScheduler(steps_per_block=options.steps_per_block),
                          cache=DualCache(), gen_length=options.gen_length, block_length=options.block_length,
                          stop_at_eos=False)
    prompts = prompts_for(model, options, requests)
    sync = device_sync(torch.device(o.device)) or (lambda: None)
    phases = {}
    for phase in ("queued", "arriving"):
        engine = Engine(model, tokenizer=None, max_batch_size=max_batch)
        pending = [Request(f"{phase}-{i}", tuple(p), config) for i, p in enumerate(prompts)]
        outputs = []
        sync()
        started = time.perf_counter()
        if phase == "queued":
            for request in pending:
                engine.add(request)
            pending = []
        while pending or engine.has_work:
            if pending:
                engine.add(pending.pop(0))
            outputs += [u.output for u in engine.step() if u.output is not None]
        sync()
        wall = time.perf_counter() - started
        latencies = sorted(out.seconds for out in outputs)
        phases[phase] = {"requests": len(outputs), "wall_seconds": wall, "engine_steps": engine.steps,
                         "tokens_per_second": sum(len(out.tokens) for out in outputs) / wall,
                         "latency_p50": latencies[len(latencies) // 2],
                         "latency_max": latencies[-1]}
    return {"requests": requests, "max_batch": max_batch, "cache": "dual", "runtime": "compact", **phases}


def run_device(o: DeviceOptions, say: Callable[[str], None] = print) -> tuple[dict[str, Any], Path]:
    """Every stage within the budget; returns the report and the JSON's path (rewritten after each
    stage)."""
    from dllm_decode.devices import check_device, device_name
    from dllm_decode.eval.bench.shaped import ShapedOptions, format_shaped, run_shaped
    from dllm_decode.outputs import atomic_write

    device = check_device(o.device)
    started = time.perf_counter()
    name = device_name(device)
    stamp = datetime.datetime.now(datetime.timezone.utc)
    folder = Path(o.root) / "measurements" / f"{slug(name)}_{stamp:%Y-%m-%d}"
    path = folder / ("gpu_measure_quick.json" if o.quick else "gpu_measure.json")
    invocation = shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv and sys.argv[0] else None
    report: dict[str, Any] = {"about": "dllm-decode device measurement (dllm_decode.eval.bench.device)",
                              "started_utc": stamp.isoformat(timespec="seconds"), "quick": o.quick,
                              "budget_seconds": o.budget, "invocation": invocation,
                              "environment": environment(device, o.commit), "commands": {}, "stages": {},
                              "skipped": {}, "failed": {}, "tables": {}}
    say(f"device: {name}; torch {torch.__version__}, CUDA {torch.version.cuda}, driver "
        f"{report['environment']['driver']}; commit {report['environment']['commit']}")
    folder.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        report["elapsed_seconds"] = round(time.perf_counter() - started, 1)
        atomic_write(path, json.dumps(report, indent=1, default=str) + "\n", "device report")

    save()
    shaped = shaped_stages(o)
    scale = 0.01 if o.quick else 1.0
    for stage in o.stages or tuple(STAGE_COST):
        left = o.budget - (time.perf_counter() - started)
        if STAGE_COST[stage] * scale > left:
            report["skipped"][stage] = f"budget: {left:.0f} s left, the stage usually takes {STAGE_COST[stage] * scale:.0f} s"
            say(f"{stage}: skipped ({report['skipped'][stage]})")
            save()
            continue
        if stage in ("block_peer",) and not o.peers:
            report["skipped"][stage] = "no --peer given"
            continue
        say(f"{stage} ...")
        stage_started = time.perf_counter()
        try:
            if stage in shaped:
                report["commands"][stage] = command_line(o, shaped[stage])
                result = run_shaped(ShapedOptions(**shaped[stage]), say)
                report["tables"][stage] = format_shaped(result).splitlines()
                say(format_shaped(result))
            elif stage == "sanity":
                report["commands"][stage] = "dllm_decode.eval.bench.device.sanity (sync debug mode around replays)"
                result = sanity(o)
            elif stage == "low_precision":
                report["commands"][stage] = "dllm_decode.eval.bench.device.low_precision (QuantLinear vs bf16)"
                result = low_precision(o)
            elif stage == "invariance":
                from dllm_decode.eval.bench.invariance import format_invariance, run_invariance

                report["commands"][stage] = "dllm_decode.eval.bench.invariance.run_invariance"
                result = run_invariance(invariance_options(o), say)
                report["tables"][stage] = format_invariance(result).splitlines()
                say(format_invariance(result))
            else:
                report["commands"][stage] = "dllm_decode.eval.bench.device.engine_load (Engine, in process)"
                result = engine_load(o)
            result["seconds"] = round(time.perf_counter() - stage_started, 1)
            report["stages"][stage] = result
        except (RuntimeError, ValueError, torch.cuda.OutOfMemoryError) as err:     # the next stage may still run
            report["failed"][stage] = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
            say(f"{stage}: FAILED {report['failed'][stage]}")
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
        save()
    report["targets"] = targets(report)
    save()
    say(f"wrote {path} ({report['elapsed_seconds']} s)")
    return report, path


def targets(report: dict[str, Any]) -> dict[str, Any]:
    """The captured-step targets read off the rows (None where a row is missing): the batch-1
    cached step's replay against its own weight-read floor (target <= 1.5x; the decode's average
    forward, refreshes included, is kept beside it as `batch1_captured_x_read_floor`), captured
    against eager tokens/s (>= 2x), float32 token identity and bf16 agreement, loop overhead at
    batch 1 (<= 2%), batch 32-64 captured against eager (>= 1x), this project against Fast-dLLM
    v1's loop (>= 1.5x, identical tokens); per model and cache, the share of requests whose bf16
    tokens move with their batch under torch's defaults, and the options under which none moves."""
    def rows(stage: str) -> list[dict[str, Any]]:
        return [r for r in report["stages"].get(stage, {}).get("rows", []) if r.get("available")]

    def pick(stage: str, **keys: Any) -> dict[str, Any] | None:
        return next((r for r in rows(stage) if all(r.get(k) == v for k, v in keys.items())), None)

    captured = pick("batch1", runtime="compact", variant="captured", cache="dual", batch=1)
    cached = report["stages"].get("sanity", {}).get("cached_step") or {}
    identity = [r for r in rows("identity") if r["variant"] == "captured"]
    eager = pick("batch1", runtime="compact", variant="eager", cache="dual", batch=1)
    peer = next((r for r in rows("batch1") if r["runtime"].startswith("peer:fast-dllm-v1")), None)
    large = [r for r in rows("large_batch") if r["variant"] == "captured"]
    invariant = report["stages"].get("invariance", {}).get("rows", [])
    return {
        "batch1_cached_step_replay_ms": cached.get("replay_ms"),
        "batch1_cached_step_read_floor_ms": cached.get("read_floor_ms"),
        "batch1_cached_step_x_read_floor": cached.get("x_read_floor"),
        "fp32_captured_identical_tokens": ({f"{r['cache']}@B{r['batch']}": r["identical_tokens"] for r in identity}
                                           or None),
        "batch1_bf16_token_agreement": captured and captured.get("token_agreement"),
        "low_precision_step_vs_bf16_batch1": _step_ratios(report["stages"].get("low_precision", {})),
        "batch1_captured_ms_per_forward": captured and captured["ms_per_forward"],
        "batch1_read_floor_ms": captured and captured["read_floor_ms"],
        "batch1_captured_x_read_floor": (captured["ms_per_forward"] / captured["read_floor_ms"]
                                         if captured and captured["read_floor_ms"] else None),
        "batch1_captured_vs_eager": captured and captured["vs_eager"],
        "batch1_overhead_captured": captured and captured["overhead"],
        "batch1_overhead_eager": eager and eager["overhead"],
        "large_batch_captured_vs_eager": {f"{r['cache']}@B{r['batch']}": r["vs_eager"] for r in large},
        "invariance_differing_requests_default": {f"{r['model']}@{r['cache']}": r["differing_requests"]
                                                  for r in invariant if r["option"] == "default"} or None,
        "invariance_restored_by": report["stages"].get("invariance", {}).get("restores"),
        "vs_fast_dllm_v1": peer and {"ours_speedup": peer.get("ours_speedup"), "ours_best": peer.get("ours_best"),
                                     "identical_tokens": peer.get("identical_tokens"), "commit": peer.get("commit")},
    }


def main(argv: list[str] | None = None) -> int:
    """The script's command line (argparse, not click: the device machine may have only torch)."""
    import argparse

    from dllm_decode.eval.bench.peers import parse_peer

    parser = argparse.ArgumentParser(prog="gpu_measure.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="every stage on the CPU at the embedded shape")
    parser.add_argument("--device", default=None, help="cuda (default), or cpu with --quick")
    parser.add_argument("--budget", type=float, default=None, help="seconds for the stages [420; 60 with --quick]")
    parser.add_argument("--peer", action="append", default=[], metavar="NAME=PATH",
                        help="a peer's local checkout (fast-dllm=PATH); repeatable")
    parser.add_argument("--root", default=".", help="where measurements/<device>_<date>/ is made [.]")
    parser.add_argument("--commit", default=None, help="the commit measured (when the copy has no .git)")
    parser.add_argument("--stage", action="append", default=None, choices=list(STAGE_COST),
                        help="run only these stages; repeatable")
    args = parser.parse_args(argv)
    try:
        peers = tuple(parse_peer(text) for text in args.peer)
        options = DeviceOptions(device=args.device or ("cpu" if args.quick else "cuda"), quick=args.quick,
                                budget=args.budget or (60.0 if args.quick else 420.0), peers=peers,
                                root=args.root, commit=args.commit,
                                stages=tuple(args.stage) if args.stage else None)
        if torch.device(options.device).type == "cpu":
            torch.set_num_threads(1)
        run_device(options, lambda line: print(line, file=sys.stderr, flush=True))
    except ValueError as err:
        parser.exit(2, f"gpu_measure.py: error: {err}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
