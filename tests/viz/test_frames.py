"""The frames rebuilt from a trace, and the generation-order metrics."""

from __future__ import annotations

import random

import pytest
import torch

from dllm_decode.viz.frames import result_frames, sample_frames
from dllm_decode.viz.order import afp, kendall_tau_b, order_stats


def test_frames_replay_the_decode(traced):
    result, _ = traced
    samples = result_frames(result)
    assert len(samples) == 2
    for b, sample in enumerate(samples):
        assert sample.steps == int(result.nfe[b])
        assert list(sample.frames[-1].tokens) == result.tokens[b].tolist()
        assert set(sample.frames[-1].state) == {"committed"}
        seen: set[int] = set()
        for frame in sample.frames:
            assert not seen & set(frame.committed), "a position committed twice without a revision"
            seen |= set(frame.committed)
            for p, state in enumerate(frame.state):
                assert (frame.tokens[p] is None) == (state == "masked")
                if state == "provisional":
                    assert frame.confidence[p] is not None
        # a committed token never changes (threshold does not revise)
        for earlier, later in zip(sample.frames, sample.frames[1:]):
            for p, state in enumerate(earlier.state):
                if state == "committed":
                    assert later.tokens[p] == earlier.tokens[p]
        assert all(1 <= s <= sample.steps for s in sample.finalized_at)


def _entry(rows, offset, commit, tokens, confidence, remask=None, edit=None):
    entry = {"rows": torch.tensor(rows), "offset": offset, "commit": torch.tensor(commit),
             "tokens": torch.tensor(tokens), "confidence": torch.tensor(confidence), "block_step": 0}
    if remask is not None:
        entry.update(remask=torch.tensor(remask), edit=torch.tensor(edit))
    return entry


def test_revisions_are_marked():
    inf = float("-inf")
    trace = [
        _entry([0], 0, [[True, False, False]], [[7, 8, 9]], [[0.9, 0.4, 0.3]],
               [[False] * 3], [[False] * 3]),
        _entry([0], 0, [[False, True, True]], [[7, 8, 9]], [[inf, 0.8, 0.7]],
               [[True, False, False]], [[False] * 3]),
        _entry([0], 0, [[True, False, False]], [[6, 5, 9]], [[0.95, inf, inf]],
               [[False] * 3], [[False, True, False]]),
    ]
    s = sample_frames(trace, 0, [6, 5, 9], answer_length=3)
    first, second, third = s.frames
    assert first.state == ("committed", "provisional", "provisional") and first.tokens == (7, 8, 9)
    assert second.state == ("masked", "committed", "committed") and second.revised == (0,)
    assert third.tokens == (6, 5, 9) and third.revised == (1,) and third.committed == (0,)
    assert s.revisions == (1, 1, 0) and s.finalized_at == (3, 3, 2)


def test_rows_that_skip_a_step_and_a_second_block():
    trace = [
        _entry([0, 1], 0, [[True, True], [True, False]], [[1, 2], [3, 4]], [[0.9, 0.9], [0.9, 0.1]]),
        _entry([1], 0, [[False, True]], [[3, 4]], [[float("-inf"), 0.8]]),
        _entry([0, 1], 2, [[True, True], [True, True]], [[5, 6], [7, 8]], [[0.9, 0.9], [0.9, 0.9]]),
    ]
    a = sample_frames(trace, 0, [1, 2, 5, 6], 4)
    b = sample_frames(trace, 1, [3, 4, 7, 8], 4)
    assert a.steps == 2 and b.steps == 3
    assert a.finalized_at == (1, 1, 2, 2) and b.finalized_at == (1, 2, 3, 3)
    assert b.frames[0].state == ("committed", "provisional", "masked", "masked")


def test_afp_and_kendall_tau_follow_the_definition():
    assert afp([1, 2, 3, 4]) == 1.0                      # one token a step
    assert afp([1, 1, 1, 1]) == 4.0                      # all at once
    assert afp([1, 1, 2, 2, 2, 5]) == 2.0                # 6 tokens over 3 distinct steps
    assert kendall_tau_b(range(4), [1, 2, 3, 4]) == pytest.approx(1.0)
    assert kendall_tau_b(range(4), [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert kendall_tau_b(range(3), [2, 2, 2]) is None
    stats = order_stats([3, 1, 2, 1, 1], answer_length=3)  # the answer's 3 positions only
    assert stats.positions == 3 and stats.afp == 1.0 and stats.kendall_tau == pytest.approx(-1 / 3)


def test_kendall_tau_b_matches_scipy_with_ties():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = random.Random(0)
    for _ in range(20):
        n = rng.randint(2, 30)
        steps = [rng.randint(1, 6) for _ in range(n)]
        expected = scipy_stats.kendalltau(range(n), steps).statistic
        got = kendall_tau_b(range(n), steps)
        if got is None:
            assert expected != expected          # nan
        else:
            assert got == pytest.approx(expected, abs=1e-12)


def test_a_result_without_trace_is_refused(traced):
    import dataclasses

    result, _ = traced
    with pytest.raises(ValueError, match="trace=True"):
        result_frames(dataclasses.replace(result, trace=None))


def test_vectorised_finalisation_steps_equal_the_frames(traced):
    from dllm_decode.viz.order import finalization_steps, result_order

    result, _ = traced
    steps = finalization_steps(result).tolist()
    samples = result_frames(result)
    assert steps == [list(s.finalized_at) for s in samples]
    for stats, sample in zip(result_order(result), samples):
        assert stats == order_stats(sample.finalized_at, sample.answer_length)
        assert 1.0 <= stats.afp <= stats.positions


def test_finalisation_steps_follow_revisions():
    from types import SimpleNamespace

    from dllm_decode.viz.order import finalization_steps

    inf = float("-inf")
    trace = [
        _entry([0], 0, [[True, False, False]], [[7, 8, 9]], [[0.9, 0.4, 0.3]], [[False] * 3], [[False] * 3]),
        _entry([0], 0, [[False, True, True]], [[7, 8, 9]], [[inf, 0.8, 0.7]], [[True, False, False]], [[False] * 3]),
        _entry([0], 0, [[True, False, False]], [[6, 5, 9]], [[0.95, inf, inf]], [[False] * 3], [[False, True, False]]),
    ]
    result = SimpleNamespace(trace=trace, tokens=torch.tensor([[6, 5, 9]]))
    assert finalization_steps(result).tolist() == [[3, 3, 2]]
