"""Tensor-parallel sizes and models that do not fit are refused with one-line errors, in a single
process (no launch): the same checks `load_model(tensor_parallel=)` and the CLI surfaces run."""

from __future__ import annotations

import pytest
import torch

from dllm_decode.models.loading import load_model
from dllm_decode.parallel import (ParallelError, ParallelGroups, check_tensor_parallel,
                                  current_groups, init_parallel, shard_model)
from dllm_decode.parallel.plan import check_divisible, legal_sizes, vocab_slice
from dllm_decode.testing import tiny_llada


@pytest.mark.parametrize("bad", [0, -2, True, "2", 1.5, None])
def test_tensor_parallel_must_be_a_positive_int(bad):
    with pytest.raises(ParallelError, match="tensor_parallel must be a positive integer"):
        check_tensor_parallel(bad, 4)


def test_world_must_be_a_multiple_of_tp():
    with pytest.raises(ParallelError, match="does not divide the world size 6"):
        check_tensor_parallel(4, 6)
    assert check_tensor_parallel(2, 6) == 2


def test_single_process_needs_torchrun(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ParallelError, match="torchrun --nproc_per_node 2"):
        load_model("embedded", tensor_parallel=2)
    with pytest.raises(ParallelError, match="positive integer"):
        load_model("embedded", tensor_parallel=0)


def test_tp1_in_one_process_is_a_no_op(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    groups = init_parallel(1)
    assert groups.single and (groups.rank, groups.world, groups.tp_rank, groups.dp_rank) == (0, 1, 0, 0)
    assert current_groups() is groups and groups.tp_group is None
    model = tiny_llada()
    assert shard_model(model, groups) is model
    assert load_model("embedded", tensor_parallel=1).parts()[1][0].n_heads == 6


def test_heads_that_do_not_divide_name_the_legal_sizes():
    with pytest.raises(ParallelError, match=r"cannot split 6 attention heads.*legal sizes for "
                                            r"this model: \[1, 2\]"):
        check_divisible(6, 6, 512, 4)             # the embedded models (512 % 3 != 0 too)
    with pytest.raises(ParallelError, match="key/value heads"):
        check_divisible(12, 3, 48, 4)            # neither 3 % 4 nor 4 % 3
    check_divisible(8, 2, 48, 4)                 # KV heads replicated: 4 % 2 == 0
    assert legal_sizes(28, 4, 18944, limit=8) == [1, 2, 4]     # Dream-7B / Qwen2.5-7B


def test_sharding_a_model_of_another_kind_is_refused():
    groups = ParallelGroups(tp=2, world=2)
    with pytest.raises(ParallelError, match="dense Llama-style families"):
        shard_model(torch.nn.Linear(2, 2), groups)          # (LLaDA2 has its own plan: EP)


def test_vocab_padding_rows():
    """V = 129 over 2 ranks: 65 rows each, the second rank's last row padding."""
    first, second = (vocab_slice(129, ParallelGroups(tp=2, world=2, tp_rank=r)) for r in (0, 1))
    assert (first.start, first.stop, first.local) == (0, 65, 65)
    assert (second.start, second.stop, second.local) == (65, 129, 65)
    last = vocab_slice(5, ParallelGroups(tp=4, world=4, tp_rank=3))
    assert (last.start, last.stop, last.local) == (5, 5, 2)          # all padding


def test_a_copied_sharded_model_keeps_its_groups():
    import copy

    groups = ParallelGroups(tp=2, world=2)
    model = shard_model(tiny_llada(), groups)
    assert copy.deepcopy(model).tensor_parallel is groups


def test_shards_stay_on_the_whole_models_device():
    """`shard_model` without a reader slices the model's own weights where they are (a GPU's
    model keeps its shards on that GPU; here: the meta device), never on the CPU by default."""
    with torch.device("meta"):
        model = tiny_llada()
    groups = ParallelGroups(tp=2, dp=1, rank=1, world=2, tp_rank=1, dp_rank=0,
                            tp_group_name="unused", dp_group_name="unused", mesh=None)
    shard_model(model, groups)
    devices = {t.device.type for t in [*model.parameters(), *model.buffers()]}
    assert devices == {"meta"}, devices
