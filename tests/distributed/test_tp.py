"""Tensor parallelism on CPU with gloo: TP logits equal one process within
`TENSOR_PARALLEL_ULPS`, are bitwise identical across ranks, greedy float32 decodes are
token-identical over the whole scheduler registry and every cache a family accepts, per-rank
loading holds about 1/tp of the weights, and each forward issues exactly the collectives the plan
names. The launches run `tests/distributed/tp_ranks.py` under torchrun (`harness.run_ranks`)."""

from __future__ import annotations

import json

import pytest
import torch

from dllm_decode.testing import TENSOR_PARALLEL_ULPS
from tests.distributed.harness import run_ranks

FAST_FAMILIES = "embedded,embedded-bd,llada,llada_tied,dream,dream_tied,fast_dllm,sdar"
"""Every dense family (tied and untied heads, GQA, q/k norms, the V = 129 vocabulary padding)."""

FOUR_HEAD_FAMILIES = "llada,dream,fast_dllm,sdar"
"""Families whose tiny models split 4 ways (the embedded ones have 6 heads: TP 4 is refused);
Dream, Fast-dLLM v2 and SDAR have 2 KV heads, so TP 4 replicates each KV head on 2 ranks."""


def check_logits(results: list[dict], tp: int) -> None:
    first = results[0]
    for key, record in first.items():
        assert record["ulps"] <= TENSOR_PARALLEL_ULPS, (key, record["ulps"])
        if key.endswith("/dtensor"):      # DTensor's parallelize_module: the same layout
            assert record["ulps_explicit"] <= TENSOR_PARALLEL_ULPS, (key, record)
            assert record["counts"] == first[key.replace("dtensor", "reference")]["counts"], key
            continue
        for other in results[1:]:
            assert other[key]["digest"] == record["digest"], f"{key}: ranks differ"
        layers = record["layers"]
        # 2 all_reduces per layer (o, down) + the vocab-parallel embedding; one gather of the window
        assert record["counts"] == {"all_reduce": 2 * layers + 1, "all_gather_into_tensor": 1}, key
        batch, window, vocab = record["shape"]
        padded = -(-vocab // tp) * tp
        assert record["bytes"]["all_gather_into_tensor"] == batch * window * padded // tp * 4, key


def test_tp2_logits_equal_one_process_bitwise_across_ranks(tmp_path):
    results = run_ranks("tests.distributed.tp_ranks", 2, tmp_path, "logits", FAST_FAMILIES)
    check_logits(results, 2)
    assert {"llada/dtensor", "embedded/dtensor"} <= set(results[0])
    assert results[0]["embedded/compact"]["heads"] == 3 and results[0]["llada/reference"]["heads"] == 2


@pytest.mark.slow
def test_tp4_logits_equal_one_process_bitwise_across_ranks(tmp_path):
    results = run_ranks("tests.distributed.tp_ranks", 4, tmp_path, "logits", FOUR_HEAD_FAMILIES)
    check_logits(results, 4)


def check_decodes(results: list[dict]) -> None:
    for name, record in results[0].items():
        whole = record["whole"]
        decoded = [k for k, v in whole.items() if not isinstance(v, str)]
        assert len(decoded) >= 80, f"{name}: only {len(decoded)} scheduler x cache pairs decoded"
        for key, tokens in whole.items():
            for rank in results:
                got = rank[name]["tp"][key]
                if isinstance(tokens, str) and tokens.startswith("failed"):
                    assert got == tokens, (key, got)          # the same failure on every rank
                elif isinstance(tokens, str):        # refused in one process: refused under TP
                    assert isinstance(got, str) and got.startswith("refused"), (key, got)
                else:
                    assert got == tokens, f"{name} {key}: TP differs from one process"
        # per forward: 2 all_reduces per layer + 1 (embedding), one gather; nothing else (a
        # token-shifted family runs one forward more than its rows' largest NFE)
        steps, layers = record["steps"], record["layers"]
        for rank in results:
            counts = rank[name]["decode_counts"]
            forwards = counts["all_gather_into_tensor"]       # one gather per forward
            assert set(counts) == {"all_reduce", "all_gather_into_tensor"}, counts
            assert counts["all_reduce"] == forwards * (2 * layers + 1) and forwards >= steps > 0
            # one host sync per step (plus one per block start) on every rank, as in one process
            syncs = rank[name]["host_syncs"]
            assert 0 < syncs["syncs"] <= syncs["forwards"] + syncs["blocks"], syncs


def test_tp2_greedy_decodes_token_identical_over_the_registry(tmp_path):
    """LLaDA layout: every scheduler x every cache it accepts (the refusals must agree too)."""
    check_decodes(run_ranks("tests.distributed.tp_ranks", 2, tmp_path, "decode", "llada", timeout=900))


@pytest.mark.slow
def test_tp2_greedy_decodes_other_families(tmp_path):
    check_decodes(run_ranks("tests.distributed.tp_ranks", 2, tmp_path, "decode",
                            "dream,fast_dllm,sdar,embedded-bd", timeout=1800))


@pytest.mark.slow
def test_tp4_greedy_decodes_token_identical(tmp_path):
    check_decodes(run_ranks("tests.distributed.tp_ranks", 4, tmp_path, "decode",
                            "llada,fast_dllm", timeout=1800))


def write_sharded_checkpoint(directory, shards: int = 4) -> int:
    """A LLaDA-layout float32 checkpoint of ~134 MB in `shards` files with an index; returns its
    weight bytes."""
    from safetensors.torch import save_file

    from dllm_decode.models.llada import LLaDAConfig, LLaDAModelLM

    config = LLaDAConfig(d_model=512, n_heads=8, n_layers=6, mlp_hidden_size=2048,
                         vocab_size=8192, mask_token_id=8191, eos_token_id=8190, pad_token_id=8190)
    model = LLaDAModelLM(config)
    generator = torch.Generator().manual_seed(0)
    state = {k: torch.randn(v.shape, generator=generator) * (0.05 if v.dim() > 1 else 1.0) + (
        0 if v.dim() > 1 else 1.0) for k, v in model.state_dict().items()}
    names = sorted(state)
    weight_map = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: state[n].contiguous() for n in names[i::shards]}
        save_file(part, str(directory / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (directory / "config.json").write_text(json.dumps(config.to_dict()))
    return sum(t.numel() * 4 for t in state.values())


def test_tp2_loads_only_its_slices(tmp_path):
    """Loading a 4-shard checkpoint on 2 ranks never holds a whole copy: each rank's anonymous
    memory grows by at most 0.6x the weights (about 0.5x expected) and it holds <= 0.55x."""
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    full = write_sharded_checkpoint(checkpoint)
    results = run_ranks("tests.distributed.tp_ranks", 2, tmp_path / "out", "load", str(checkpoint))
    for record in results:
        assert record["dtype"] == "torch.float32" and record["embedded_dtype"] == "torch.bfloat16"
        assert record["anon_growth"] <= 0.6 * full, record["anon_growth"] / full
        assert record["resident"] <= 0.55 * record["whole_resident"]
        assert record["ulps"] <= TENSOR_PARALLEL_ULPS
    assert results[0]["digest"] == results[1]["digest"]
    print(f"per-rank anon growth {[r['anon_growth'] / full for r in results]} of {full} B; "
          f"resident {[r['resident'] / r['whole_resident'] for r in results]}")


def check_layerwise(results: list[dict]) -> None:
    for name, record in results[0].items():
        layers = record["layers"]
        base = 2 * layers + 1                      # o and down per layer, the embedding
        for key, decoded in record["decodes"].items():
            for rank in results:
                assert rank[name]["decodes"][key]["tp"] == decoded["whole"], f"{name} {key}: TP differs"
        for key, (full, cheap) in record["steps"].items():
            for rank in results[1:]:
                assert [s["digest"] for s in rank[name]["steps"][key]] == [full["digest"], cheap["digest"]], \
                    f"{name} {key}: ranks differ"
            assert full["ulps"] <= TENSOR_PARALLEL_ULPS and cheap["ulps"] <= TENSOR_PARALLEL_ULPS, (key, full, cheap)
            assert cheap["refreshed"] == cheap["whole_refreshed"], (key, cheap)
            if key.startswith("es"):           # the same columns chosen: the logits above agree
                continue
            if key.startswith("d2"):
                # one all_reduce of every layer's head sums per step; the full step's head runs twice
                assert full["counts"] == {"all_reduce": base + 1, "all_gather_into_tensor": 2}, (key, full)
                expected = 2 if key == "d2_refresh" else 1     # refresh_k=1: every step is a full one
                assert cheap["counts"] == {"all_reduce": base + 1, "all_gather_into_tensor": expected}, (key, cheap)
                continue
            # elastic: the tracked tokens' choice per layer; a cheap step adds the drift similarity
            # per layer, and each refreshed layer runs o, down and the choice again
            assert full["counts"] == {"all_reduce": base + layers, "all_gather_into_tensor": 1}, (key, full)
            refreshed = cheap["refreshed"]
            assert refreshed == {"elastic_always": layers, "elastic_never": 0}.get(key, refreshed), (key, cheap)
            assert cheap["counts"] == {"all_reduce": base + 2 * layers + 3 * refreshed,
                                       "all_gather_into_tensor": 1}, (key, cheap)


def test_tp2_attention_reading_caches_token_identical(tmp_path):
    """d2, Elastic-Cache and ES-dLLM under TP 2: every statistic over heads is all-reduced, so greedy fp32
    decodes equal one process, the ranks' logits are bitwise equal, and each step issues the
    collectives docs/distributed.md lists (the embedded model: 6 heads, 3 per rank)."""
    check_layerwise(run_ranks("tests.distributed.tp_ranks", 2, tmp_path, "layerwise", "llada,embedded",
                              timeout=600))


BF16_MARGIN = 0.01
"""How far below the one-process bfloat16 run's agreement with float32 the TP bfloat16 run's may
fall (a fraction of the positions compared): TP adds the per-rank partial sums in another order,
so in bfloat16 it is another, equally valid rounding of the same model."""


@pytest.mark.slow
def test_tp2_bf16_agrees_with_fp32_as_one_process_bf16_does(tmp_path):
    """The embedded model, 10 prompts of each Waiting Line task (100 prompts, 1,600 greedy answer
    tokens; about 760 masked top-1 positions): TP 2 in bfloat16 agrees with the float32 run at
    least as often as one bfloat16 process does, less `BF16_MARGIN`, and the ranks agree."""
    results = run_ranks("tests.distributed.tp_ranks", 2, tmp_path, "bf16", "10", timeout=600)
    first = results[0]
    assert first["tp_dtype"] == "torch.bfloat16" and first["prompts"] == 100
    assert all(rank["digest"] == first["digest"] for rank in results)
    for metric in ("tokens", "top1"):
        (bf16, n), (tp, m) = first[metric]["bf16"], first[metric]["tp"]
        assert n == m >= 700, (metric, n, m)
        assert tp / m >= bf16 / n - BF16_MARGIN, (metric, first[metric])
