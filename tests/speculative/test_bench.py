"""The benchmark's theory column and summary on a tiny target (no timing assertions)."""

from __future__ import annotations

import math

import pytest

from dllm_decode.speculative import LookupDrafter, ModelDrafter
from dllm_decode.eval.bench.spec import (Config, measure, summarize, theory_speedup, theory_tokens,
                             tokens_per_call_by_task)
from dllm_decode.schedulers import LowConfidenceScheduler


@pytest.mark.parametrize("alpha,drafted,expected", [
    (0.0, [4], 1.0),                          # every draft rejected: one token per call
    (1.0, [4], 5.0),                          # every draft accepted: g + 1
    (0.5, [2], 1.75),                         # 1 + a + a^2
    (0.8, [0, 3], (1.0 + (1 - 0.8 ** 4) / 0.2) / 2),
])
def test_theory_tokens(alpha, drafted, expected):
    assert math.isclose(theory_tokens(alpha, drafted), expected)


def test_theory_speedup():
    assert math.isclose(theory_speedup(1.75, 2, 0.0), 1.75)         # free drafts: tokens per call
    assert math.isclose(theory_speedup(4.0, 3, 1 / 3), 2.0)         # 4 tokens for 2 target steps
    assert theory_speedup(theory_tokens(0.2, [4]), 4, 0.5) < 1.0   # speedup needs alpha > c


def test_summary_rows(target, draft_model):
    constant = LowConfidenceScheduler(steps_per_block=1)
    configs = [Config("plain", None, constant), Config("self", ModelDrafter(target), constant, 4, target),
               Config("lookup", LookupDrafter(), constant, 4)]
    prompts = [[3, 17, 5, 9, 3, 17], [8, 2, 8, 2]]
    rows = measure(target, prompts, configs, repeats=1, max_new_tokens=9, log=lambda line: None)
    plain, self_draft, lookup = summarize(rows)
    assert all(row["exact"] for row in (plain, self_draft, lookup))
    assert plain["mean_accepted_tokens"] == 1.0 and plain["target_forwards_per_token"] == 1.0
    assert self_draft["acceptance_rate"] == 1.0 and self_draft["mean_accepted_tokens"] > 4
    assert self_draft["draft_forwards_per_token"] > 0 and lookup["draft_forwards_per_token"] == 0
    assert plain["speedup"] == 1.0


def test_tokens_per_call_by_task(target):
    constant = LowConfidenceScheduler(steps_per_block=1)
    rows = measure(target, [[3, 17, 5], [8, 2, 8], [4, 4]], [Config("self", ModelDrafter(target), constant, 4, target)],
                   repeats=1, max_new_tokens=9, log=lambda line: None)
    results = rows[0].results
    by_task = tokens_per_call_by_task(["b", "a", "b"], results)
    assert list(by_task) == ["a", "b"]
    assert by_task["a"] == len(results[1].tokens) / results[1].target_forwards
    assert by_task["b"] == (len(results[0].tokens) + len(results[2].tokens)) / (
        results[0].target_forwards + results[2].target_forwards)
