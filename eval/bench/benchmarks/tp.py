"""`bench tp`: tensor-parallel scaling, the paper model and (under torchrun) the measurement
(`dllm_decode.eval.bench.tp`)."""

from __future__ import annotations

from typing import Any

from dllm_decode.eval.bench.protocol import (DEVICE, DTYPE, REPEATS, Benchmark, Option, Say, Settings,
                                             blame, count, fill, later)


def run(settings: Settings, say: Say) -> dict[str, Any] | None:
    from dllm_decode.devices import check_device
    from dllm_decode.eval.bench.tp import TPOptions, run_tp

    with blame("--device"):
        device = {"device": str(check_device(settings["device"]))} if settings.get("device") else {}
    return run_tp(fill(TPOptions, settings, **device), say)


BENCHMARK = Benchmark(
    "tp",
    "Tensor-parallel scaling: under `torchrun --nproc_per_node N -m dllm_decode bench tp` one "
    "device's forward against the N-rank tensor-parallel forward of a model of the shape (random "
    "weights), with the collectives counted and the paper model's prediction beside them; "
    "`--paper` prints the paper model's table (LLaDA-8B and LLaDA2-flash shapes, NVLink and PCIe).",
    "Defaults: LLaDA-8B's shape, bfloat16, batch 16, 32 rows fed, window 32, 5 repeats, NVLink "
    "for the prediction; --quick: the embedded shape, float32, batch 2, 16 rows, window 8, 2 repeats.",
    (Option(("--shape",), "shape", ("llada-8b", "embedded"), "The architecture, with random weights "
            "[llada-8b]."),
     count("--layers", "layers", "Fewer layers than the shape's."), DEVICE,
     DTYPE.but(help="Weights and activations [bfloat16]."),
     count("--batch", "batch", "Canvases per forward."),
     count("--rows", "rows", "Rows each canvas feeds (32: a dual-cache step of one block)."),
     count("--window", "window", "Rows whose logits the forward returns (gathered)."),
     REPEATS,
     Option(("--link",), "link", ("nvlink", "pcie"), "The link the prediction assumes [nvlink]."),
     Option(("--paper",), "paper", bool, "Print the paper model's table only (no measurement).")),
    run, later("dllm_decode.eval.bench.tp", "format_tp"),
    quick=dict(shape="embedded", dtype="float32", batch=2, rows=16, window=8, repeats=2))
