"""Per-row windows inside a step's shared window, and caches that take no newcomer mid-run."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dllm_decode.config import DecodeConfig
from dllm_decode.engine import Engine, Request
from dllm_decode.models.layers import KVCache
from dllm_decode.registry import component
from dllm_decode.row_windows import RowWindows
from dllm_decode.sampler import Decoding, generate
from dllm_decode.testing import tiny_llada


def test_a_filled_cache_leaves_the_kept_columns_of_each_row_as_stored():
    from dllm_decode.quant.kv import KVQuantStore

    for kv in (KVCache(), KVCache(store=KVQuantStore("int8"))):
        old = torch.randn(2, 1, 6, 4)
        kv.update(0, old, old.clone(), (0, 6))
        before = kv.store.read(kv.keys[0]).clone()
        kv.keep = torch.tensor([[False, False, True, True, False, False],
                                [False, False, False, False, False, True]])
        new = torch.randn(2, 1, 4, 4)
        keys, _ = kv.update(0, new, new.clone(), (2, 6))
        kept = kv.keep[:, None, :, None].expand_as(before)
        assert torch.equal(keys[kept], before[kept])                   # the very bytes stored
        fresh = KVCache(store=kv.store)
        fresh.update(0, torch.cat([old[:, :, :2], new], 2), old, (0, 6))
        written = ~kept
        assert torch.equal(keys[written], fresh.store.read(fresh.keys[0])[written])


def test_row_windows_mark_the_columns_outside_each_rows_own_window():
    rows = RowWindows(start=(4, 8), end=(8, 12), busy=(True, True))
    keep = rows.keep(lambda own: (own[0], 12), 12, torch.device("cpu"))     # a prefix cache's
    assert keep[0].tolist() == [True] * 4 + [False] * 8
    assert keep[1].tolist() == [True] * 8 + [False] * 4
    same = RowWindows(start=(4, 4), end=(8, 8), busy=(True, True))
    assert same.keep(lambda own: own, 12, torch.device("cpu")) is None        # one window for all
    waiting = RowWindows(start=(4, 4), end=(8, 8), busy=(True, False))
    assert waiting.keep(lambda own: own, 12, torch.device("cpu"))[1].all()    # nothing to recompute


def test_a_cache_with_batch_wide_state_holds_a_newcomer_until_the_running_rows_are_done():
    model = tiny_llada(seed=3)
    config = DecodeConfig(scheduler=component("scheduler", "low_confidence"), gen_length=8, block_length=4,
                          cache=component("cache", "elastic"))
    assert not config.cache.mid_run_joins and component("cache", "prefix").mid_run_joins
    assert not component("cache", {"name": "prefix", "block_refresh": False}).mid_run_joins
    decoding = Decoding(model, config.cache)
    first = decoding.add([[1, 2, 3]], config)
    decoding.step()
    assert not decoding.accepts_joins
    second = decoding.add([[4, 5]], config)
    while first not in decoding.step():
        assert [m.key for m in decoding.batch.members] == [first]      # the newcomer waits
    assert decoding.accepts_joins
    while not decoding.finished:
        decoding.step()
    assert decoding.result(second).tokens.tolist() == generate(model, [[4, 5]], config).tokens.tolist()


def test_the_engine_starts_another_running_batch_for_a_newcomer_it_cannot_join():
    model = tiny_llada(seed=3)
    config = DecodeConfig(scheduler=component("scheduler", "low_confidence"), gen_length=8, block_length=4,
                          cache=component("cache", "dllm_cache"))
    engine = Engine(model, max_batch_size=4)
    engine.add(Request("a", [1, 2, 3], config))
    engine.step()
    engine.add(Request("b", [4, 5], dataclasses.replace(config, seed=1)))
    engine.add(Request("c", [6], dataclasses.replace(config, seed=2)))
    outputs, batches = {}, 1
    while engine.has_work:
        for update in engine.step():
            if update.finished:
                outputs[update.request_id] = update.output
        batches = max(batches, engine.backend.batches)
    assert batches == 2                      # a's batch, then b and c together in a second one
    for key, prompt in (("a", [1, 2, 3]), ("b", [4, 5]), ("c", [6])):
        alone = generate(model, [prompt], config)
        assert list(outputs[key].tokens) == alone.tokens[0, :int(alone.answer_lengths[0])].tolist()


@pytest.mark.parametrize("cache, gen_length", [("elastic", 16), ("dllm_cache", 32)])
def test_rows_that_wait_for_the_others_keep_their_state(embedded, cache, gen_length):
    """Under an adaptive rule a row whose block is done waits for the others' blocks. Elastic-
    Cache leaves its state untouched and feeds each row its own range; dLLM-Cache stops its
    counter and steps rows whose counters differ apart. So 16 task prompts decoded together give
    each one's tokens alone (with the batch-wide window and counters, 1 and 8 of them moved)."""
    from dllm_decode.eval.tasks import TASKS

    examples = [e for i, name in enumerate(["sort", "copy", "reverse", "shuffle"])
                for e in TASKS[name].examples("test", 4, i)]
    ids = [embedded.tokenizer(e.prompt, add_special_tokens=False)["input_ids"] for e in examples]
    config = DecodeConfig(scheduler=component("scheduler", {"name": "threshold", "threshold": 0.9}),
                          cache=component("cache", cache), gen_length=gen_length, block_length=4)
    decoding = Decoding(embedded, config.cache)
    keys = [decoding.add([p], config) for p in ids]
    waited = False
    with torch.inference_mode():
        while not decoding.finished:
            decoding.step()
            waited = waited or not all(decoding.batch.bounds.busy)
    assert waited
    for key, p in zip(keys, ids):
        assert decoding.result(key).tokens.tolist() == generate(embedded, [p], config).tokens.tolist()
