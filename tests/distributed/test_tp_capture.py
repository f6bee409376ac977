"""Tensor parallelism x capture on CPU with gloo: a captured decode of a sharded model (static
buckets, and torch.compile of the step) gives the tokens one eager process gives, in float32,
for the whole-step route, the host-decision route and a sampled decode, on 2 and 4 ranks. The
captured forward calls the family's modules, so the vocabulary-parallel head's all-gather runs
inside it (one gather per forward, as eagerly). Launches `tests/distributed/capture_ranks.py`."""

from __future__ import annotations

import pytest

from tests.distributed.harness import run_ranks

FAMILIES = "llada,llada_tied,dream,fast_dllm"
"""Untied and tied heads, the token-shifted GQA layout, and a block-diffusion family."""


def check(results: list[dict], modes: list[str]) -> None:
    first = results[0]
    assert len(first) >= 9, sorted(first)          # 3 per cache, every family
    for key, record in first.items():
        assert record["problem"] is None, (key, record["problem"])     # TP x capture is served
        for rank in results:
            for mode in modes:
                got = rank[key][mode]
                assert got["tokens"] == record["whole"], f"{key} {mode}: captured TP differs from one process"
                assert got["nfe"] == record["nfe"], (key, mode)
                assert got["captures"] >= 1, (key, mode)           # the captured step did run
                if mode == "static":        # the head's gather ran inside the captured forward
                    assert got["gathers"] >= max(max(record["nfe"]), 1), (key, mode)


def test_tp2_captured_decodes_equal_one_process(tmp_path):
    modes = ["static", "compile:eager"]
    check(run_ranks("tests.distributed.capture_ranks", 2, tmp_path, FAMILIES, ",".join(modes),
                    timeout=900), modes)


@pytest.mark.slow
def test_tp2_captured_decodes_other_families(tmp_path):
    """The rest of the families TP serves: a tied token-shifted head, q/k norms (SDAR), the
    embedded models (6 heads, a vocabulary padded for 2 ranks)."""
    modes = ["static", "compile:eager"]
    check(run_ranks("tests.distributed.capture_ranks", 2, tmp_path, "dream_tied,sdar,embedded,embedded-bd",
                    ",".join(modes), timeout=1800), modes)


@pytest.mark.slow
def test_tp4_captured_decodes_equal_one_process(tmp_path):
    modes = ["static", "compile:eager"]
    check(run_ranks("tests.distributed.capture_ranks", 4, tmp_path, "llada,fast_dllm",
                    ",".join(modes), timeout=1800), modes)


@pytest.mark.slow
def test_tp2_inductor_captured_decodes_equal_one_process(tmp_path):
    modes = ["compile:inductor"]
    check(run_ranks("tests.distributed.capture_ranks", 2, tmp_path, "llada,dream", ",".join(modes),
                    timeout=1800), modes)
