"""The step as data: one constructor for `StepInput`, the loop's rules as pure functions, and the
batch's device bounds updated in place."""

from __future__ import annotations

import pathlib
import re

import pytest
import torch

import dllm_decode
from dllm_decode.config import DecodeConfig
from dllm_decode.interfaces import Decision
from dllm_decode.sampler import Decoding
from dllm_decode.schedulers import SCHEDULERS
from dllm_decode.step import MAX_REVISIONS, Window, resolve, step_input, truncate, write
from dllm_decode.testing import tiny_llada

ROOT = pathlib.Path(dllm_decode.__file__).resolve().parent.parent


def test_step_input_is_built_in_one_place():
    """No file but `dllm_decode/step.py` calls the `StepInput` constructor (tests included)."""
    calls = []
    for folder in ("dllm_decode", "schedulers", "caches", "filters", "eval", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            if path != ROOT / "dllm_decode" / "step.py" and re.search(r"\bStepInput\(", path.read_text()):
                calls.append(str(path.relative_to(ROOT)))
    assert calls == []


def test_step_input_derives_eligibility_confidence_and_revisable():
    logits = torch.tensor([[[0.0, 3.0, 0.0], [2.0, 0.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]])
    current = torch.tensor([[9, 4, 9, 9]])                      # 9 is [MASK]
    inp = step_input(logits=logits, current=current, block=torch.tensor([[10, 13]]), offset=10,
                     gen_span=torch.tensor([[11, 14]]), mask_id=9,
                     revisions=torch.tensor([[0, 0, 0, MAX_REVISIONS]]))
    assert inp.is_masked.tolist() == [[True, False, True, True]]
    assert inp.eligible.tolist() == [[True, False, True, False]]      # column 13 is past the block
    assert inp.candidates.tolist() == [[1, 0, 2, 0]]
    assert torch.isinf(inp.confidence[0, [1, 3]]).all() and inp.confidence[0, 0] > 0.8
    assert inp.revisable.tolist() == [[False, True, False, False]] and inp.num_steps == 3
    excluded = step_input(logits=logits, current=current, block=torch.tensor([[10, 13]]), offset=10,
                          mask_id=9, exclude=torch.tensor([[True, False, False, False]]))
    assert excluded.eligible.tolist() == [[False, False, True, False]]
    assert not step_input(logits=logits, current=current, mask_id=9).revisable.any()


def test_resolve_keeps_remasks_below_the_commits_and_write_applies_them():
    probs = torch.full((1, 4, 10), 0.05)
    probs[0, :, 2] = torch.tensor([0.6, 0.3, 0.6, 0.2])
    current = torch.tensor([[9, 2, 9, 2]])
    inp = step_input(probs=probs, current=current, mask_id=9, revisions=torch.zeros(1, 4, dtype=torch.int32),
                     gen_span=torch.tensor([[0, 4]]))
    decision = Decision(commit=torch.tensor([[True, False, True, False]]),
                        remask=torch.tensor([[False, True, False, True]]))
    res = resolve(inp, decision, revises="block")
    assert res.commit.tolist() == [[True, False, True, False]]
    assert res.remask.tolist() == [[False, False, False, True]]     # one of two: the least supported
    assert write(current, res, 9).tolist() == [[2, 2, 2, 9]]
    assert not resolve(inp, decision).remask.any()                   # a commit-only rule revises nothing


def test_truncate_cuts_from_the_new_end_and_never_into_the_prompt():
    x = torch.arange(12).view(2, 6)
    cut, mask = truncate(x, None, torch.tensor([4, 1]), torch.tensor([2, 3]), pad_id=0)
    assert cut.tolist() == [[0, 1, 2, 3, 0, 0], [6, 7, 8, 0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]]


def test_window_rows_selects_every_batch_tensor():
    w = Window(3, torch.randn(3, 2, 4), torch.arange(6).view(3, 2), torch.tensor([[3, 5]] * 3),
               torch.tensor([[1, 5]] * 3), torch.tensor([3, 3, 3]), None)
    picked = w.rows(torch.tensor([2, 0]))
    assert picked.tokens.tolist() == [[4, 5], [0, 1]] and picked.offset == 3 and picked.revisions is None
    assert w.rows(None) is w


def test_the_phase_tensors_are_updated_in_place_within_a_phase():
    decoding = Decoding(tiny_llada(), DecodeConfig(SCHEDULERS["low_confidence"]()).cache)
    decoding.add([[1, 2], [3]], DecodeConfig(SCHEDULERS["low_confidence"](), gen_length=8, block_length=4))
    decoding.step()
    phase = decoding.batch.phase
    block = phase.block
    decoding.step()
    decoding.step()                                   # the next block starts: same tensors, new values
    assert decoding.batch.phase is phase and phase.block is block
    assert phase.block[:, 1].tolist() == decoding.batch.bounds.end


def test_rows_stay_member_by_member_through_joins_drops_and_compaction():
    """The batch's rows lie member by member in member order (so the members' outcomes
    concatenated are the batch), and each member's row index follows its rows."""
    from dllm_decode.interfaces import NoCache

    decoding = Decoding(tiny_llada(), NoCache())
    low = DecodeConfig(SCHEDULERS["low_confidence"](), gen_length=8, block_length=4, stop_at_eos=False)
    decoding.add([[1, 2], [3]], low, key="a")
    decoding.add([[4]], DecodeConfig(SCHEDULERS["low_confidence"](), gen_length=4, block_length=4,
                                     stop_at_eos=False), key="b")
    seen, added = [], False
    while not decoding.finished:
        finished = decoding.step()
        if "b" in finished and not added:             # b leaves; c joins at the next phase
            decoding.add([[5, 6, 7]], low, key="c")
            added = True
        batch = decoding.batch
        if len(batch):
            assert batch.bounds.request == sorted(batch.bounds.request)
            for g, rows in batch.groups.items():
                index = batch.phase.index[g]
                assert rows == (list(range(len(batch))) if index is None else index.tolist())
            seen.append((tuple(m.key for m in batch.members), tuple(batch.bounds.request)))
    assert (("a", "b"), (0, 0, 1)) in seen and (("a", "c"), (0, 0, 1)) in seen   # b compacted away


def test_decodes_agree_bounds_the_rows_a_near_tie_may_move():
    """`testing.assert_decodes_agree`: one moved row passes, two fail, a shape change fails."""
    from types import SimpleNamespace

    from dllm_decode.testing import assert_decodes_agree

    tokens = torch.arange(12).view(3, 4)
    same = SimpleNamespace(tokens=tokens, nfe=torch.tensor([2, 2, 2]))
    one = SimpleNamespace(tokens=torch.cat([tokens[:2], tokens[2:] + 1]), nfe=same.nfe)
    two = SimpleNamespace(tokens=tokens + torch.tensor([[0], [1], [1]]), nfe=same.nfe)
    assert_decodes_agree(one, same)
    with pytest.raises(AssertionError, match=r"rows \[1, 2\] of 3"):
        assert_decodes_agree(two, same)
    with pytest.raises(AssertionError):
        assert_decodes_agree(SimpleNamespace(tokens=tokens[:2], nfe=same.nfe[:2]), same)
