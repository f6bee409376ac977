"""Expert parallelism for the LLaDA2 MoE, its static (dense, compilable) form, and LLaDA2 under
tensor parallelism (attention TP + experts EP over the same two ranks).

EP=2 runs in two gloo processes (one rank each, as under `torchrun`); each rank writes what it
saw to a file and the test compares the files with a one-process run of the same seeded model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from dllm_decode import DecodeConfig, generate
from dllm_decode.models.llada2 import LLaDA2MoE, set_moe_impl
from dllm_decode.testing import assert_logits_close, tiny_block_diffusion
from tests.distributed.launching import free_port, spawn

PROMPTS = [[3, 9, 4, 11, 5], [7, 2, 20]]
IDS = torch.tensor([[3, 9, 4, 11, 5, 8, 1, 30], [7, 2, 20, 6, 6, 14, 25, 12]])


def _model(impl: str = "loop"):
    return set_moe_impl(tiny_block_diffusion("llada2", layers=3), impl)


def _decode(model, cache: str) -> list[list[int]]:
    config = DecodeConfig.from_dict({"scheduler": {"name": "threshold", "threshold": "0.5"},
                                     "cache": cache, "gen_length": 8, "block_length": 4})
    return generate(model, PROMPTS, config).tokens.tolist()


def _router_outputs(model) -> list[list[float]]:
    h = torch.randn(6, 32, generator=torch.Generator().manual_seed(5))
    moe = next(m for m in model.modules() if isinstance(m, LLaDA2MoE))
    experts, weights = moe.gate(h)
    return [experts.tolist(), weights.tolist()]


def test_static_moe_equals_the_loop_in_float32():
    loop, static = _model("loop"), _model("static")
    with torch.no_grad():
        assert_logits_close(static(IDS), loop(IDS))
    for cache in ("none", "block"):
        assert _decode(static, cache) == _decode(loop, cache)


def test_static_moe_shares_the_experts_weights_and_restacks_after_a_move():
    model = _model("static")
    count = sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        before = model(IDS)
        moe = next(m for m in model.modules() if isinstance(m, LLaDA2MoE))
        gate_up, down = moe._stacked
        assert moe.experts[3].down_proj.weight.data_ptr() == down[3].data_ptr()     # views, one copy
        model.to(torch.float64)
        assert moe._stacked is None                                                 # rebuilt on use
        after = model(IDS.clone()).float()
    assert sum(p.numel() for p in model.parameters()) == count
    assert_logits_close(after, before)
    with pytest.raises(ValueError, match="accepted: \\['loop', 'static'\\]"):
        set_moe_impl(model, "grouped")


def test_static_moe_compiles_without_graph_breaks():
    moe = next(m for m in _model("static").modules() if isinstance(m, LLaDA2MoE))
    h = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(1))
    from torch import _dynamo

    _dynamo.reset()
    explanation = _dynamo.explain(moe)(h)
    assert explanation.graph_break_count == 0
    with torch.no_grad():
        compiled = torch.compile(moe, fullgraph=True, dynamic=False, backend="eager")
        assert_logits_close(compiled(h), moe(h))


def test_expert_counts_that_do_not_divide_are_refused():
    from dllm_decode.parallel.experts import expert_range

    assert expert_range(8, 1, 2) == (4, 8)
    with pytest.raises(ValueError, match="divisible by 3; accepted sizes: \\[1, 2, 4, 8\\]"):
        expert_range(8, 0, 3)


# ---- two gloo ranks ------------------------------------------------------------------------

def _ep_worker(rank: int, world: int, port: int, out: str, impl: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo")
    try:
        from dllm_decode.parallel.experts import shard_experts

        model = shard_experts(_model(impl))
        held = [m.expert_range for m in model.modules() if isinstance(m, LLaDA2MoE)]
        experts = sum(1 for m in model.modules() if isinstance(m, LLaDA2MoE) for _ in m.experts)
        with torch.no_grad():
            logits = model(IDS).tolist()
            record = {"held": held, "experts": experts, "logits": logits,
                      "router": _router_outputs(model),
                      "none": _decode(model, "none"), "block": _decode(model, "block")}
        Path(out, f"rank{rank}.json").write_text(json.dumps(record))
        torch.distributed.barrier()
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["loop", "static"])
def test_two_ranks_of_experts_equal_one_process(tmp_path, impl):
    one = _model("loop")
    with torch.no_grad():
        expected = one(IDS)
    spawn(_ep_worker, (2, free_port(), str(tmp_path), impl), 2, tmp_path)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["held"] for r in ranks] == [[[0, 4]] * 2, [[4, 8]] * 2]      # 2 MoE layers
    assert [r["experts"] for r in ranks] == [8, 8]            # 4 of 8 experts in each of 2 layers
    assert ranks[0]["router"] == ranks[1]["router"] == _router_outputs(one)   # bitwise
    assert ranks[0]["logits"] == ranks[1]["logits"]                          # same bytes everywhere
    assert_logits_close(torch.tensor(ranks[0]["logits"]), expected)
    for cache in ("none", "block"):
        assert all(r[cache] == _decode(one, cache) for r in ranks)


def _tp_worker(rank: int, world: int, port: int, out: str, impl: str, checkpoint: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    from dllm_decode.models.loading import load_model
    from dllm_decode.parallel import CollectiveCounter, init_parallel, shard_model, shutdown_parallel

    try:
        groups = init_parallel(world)
        model = set_moe_impl(shard_model(_model(), groups), impl)
        loaded = set_moe_impl(load_model(checkpoint, dtype=torch.float32, tensor_parallel=world),
                              impl)
        with torch.no_grad(), CollectiveCounter() as counter:
            logits = model(IDS, rows=(4, 8))
        with torch.no_grad():
            record = {"router": _router_outputs(model), "logits": logits.tolist(), "loaded": loaded(IDS, rows=(4, 8)).tolist(),
                      "counts": dict(counter.counts), "events": [
                          [op, list(shape), str(dtype)] for op, shape, dtype, _ in counter.events],
                      "qkv": list(model.model.layers[0].attention["query_key_value"].weight.shape),
                      "none": _decode(model, "none"), "block": _decode(model, "block")}
        Path(out, f"rank{rank}.json").write_text(json.dumps(record))
    finally:
        shutdown_parallel()


@pytest.mark.parametrize("world, impl", [(2, "static"), pytest.param(2, "loop", marks=pytest.mark.slow),
                                         pytest.param(4, "static", marks=pytest.mark.slow)])
def test_tensor_and_expert_parallel_llada2_equals_one_process(tmp_path, world, impl):
    """TP attention (fused q|k|v split per head slot; at TP=4 the 2 KV heads are replicated),
    EP experts, vocabulary-parallel embedding and head (V = 37 padded to 38 or 40): the window's
    logits and greedy decodes equal one process; a checkpoint loaded with `tensor_parallel`
    equals the in-memory sharding."""
    one = _model("loop")
    one.save_pretrained(tmp_path / "ckpt")
    with torch.no_grad():
        expected = one(IDS, rows=(4, 8))
    spawn(_tp_worker, (world, free_port(), str(tmp_path), impl, str(tmp_path / "ckpt")), world,
          tmp_path)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    # 4 heads, 2 KV heads of width 8: TP=2 holds 2 q + 1 k + 1 v heads, TP=4 1 q + 1 k + 1 v
    assert all(r["qkv"] == [(4 // world + 2) * 8, 32] for r in ranks)
    assert all(r["router"] == _router_outputs(one) for r in ranks)            # bitwise
    assert all(r["logits"] == ranks[0]["logits"] == r["loaded"] for r in ranks)
    assert_logits_close(torch.tensor(ranks[0]["logits"]), expected)
    layers = 3
    assert ranks[0]["counts"] == {"all_reduce": 2 * layers + 1, "all_gather_into_tensor": 1}
    moe_reduces = [e for e in ranks[0]["events"] if e[0] == "all_reduce" and e[2] == "torch.float32"]
    assert len(moe_reduces) == 2 * layers + 1        # fp32 model: every reduce in fp32
    for cache in ("none", "block"):
        assert all(r[cache] == _decode(one, cache) for r in ranks)
