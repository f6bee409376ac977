"""Every registered scheduler, default-constructed, keeps the contract of `Scheduler`."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_decode.caches import CACHES
from dllm_decode import DecodeConfig, generate
from dllm_decode.config import accepts_cache
from dllm_decode.registry import component, component_dict
from dllm_decode.testing import tiny_llada
from dllm_decode.schedulers import MASK_SCHEDULERS, SCHEDULERS
from tests.schedulers.inputs import clone, rows, same, step_input

NAMES = sorted(MASK_SCHEDULERS)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10]]
DRAWS_RANDOM_SCORES = {"random"}     # one stream per batch: rows match one-by-one only in counts


def random_input(seed: int, batch: int = 3, width: int = 10, vocab: int = 11, offset: int = 3,
                 step: int = 0):
    """A view like the loop's: rows with different blocks inside the window, one row with no work."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, width, vocab, generator=g) * 3
    masked = torch.rand(batch, width, generator=g) < 0.7
    starts = torch.randint(0, width // 2, (batch,), generator=g)
    ends = starts + torch.randint(1, width // 2 + 1, (batch,), generator=g)
    block = [(offset + int(s), offset + int(e)) for s, e in zip(starts, ends)]
    masked[-1, starts[-1]:ends[-1]] = False                     # the last row waits for the others
    return step_input(logits, masked=masked, block=block, offset=offset, step=step,
                      gen_span=[(offset, offset + width)] * batch,
                      generator=torch.Generator().manual_seed(seed))


def run_hooks(scheduler, inp, state):
    """The loop's order for one step (block_end only at step 0)."""
    logits, state = scheduler.process_logits(inp, state)
    ends = None
    if inp.step == 0:
        ends, state = scheduler.block_end(inp, state)
    decision, state = scheduler.select(inp, state)
    return logits, ends, decision, state


@pytest.mark.parametrize("name", NAMES)
def test_default_constructible_frozen_and_citing_its_paper(name):
    cls = SCHEDULERS[name]
    scheduler = cls()
    assert scheduler == cls() and hash(scheduler) == hash(cls())
    with pytest.raises(dataclasses.FrozenInstanceError):
        scheduler.anything = 1
    assert "arXiv" in (sys.modules[cls.__module__].__doc__ or "") + (cls.__doc__ or "")


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_commits_only_eligible_positions_and_leaves_its_input_alone(name, seed):
    scheduler = SCHEDULERS[name]()
    state = scheduler.init_state(3, torch.device("cpu"))
    for step in range(3):                                  # exercise carried state too
        inp = random_input(seed, step=step)
        before = clone(inp)
        logits, ends, decision, state = run_hooks(scheduler, inp, state)
        assert same(inp, before), "a hook modified its input"
        assert not (decision.commit & ~inp.eligible).any()
        assert decision.commit.shape == inp.eligible.shape
        if logits is not None:
            assert logits.shape == inp.logits.shape
        if ends is not None:
            assert ends.shape == (3,) and (ends > inp.block[:, 0]).all()


@pytest.mark.parametrize("name", NAMES)
def test_batch_of_three_equals_three_batches_of_one(name):
    scheduler = SCHEDULERS[name]()
    batched = scheduler.init_state(3, torch.device("cpu"))
    alone = [scheduler.init_state(1, torch.device("cpu")) for _ in range(3)]
    for step in range(3):
        inp = random_input(7, step=step)
        logits, ends, decision, batched = run_hooks(scheduler, inp, batched)
        for row in range(3):
            one = rows(inp, [row])
            one_logits, one_ends, one_decision, alone[row] = run_hooks(scheduler, one, alone[row])
            if name in DRAWS_RANDOM_SCORES:
                assert decision.commit[row].sum() == one_decision.commit[0].sum()
                continue
            assert torch.equal(decision.commit[row], one_decision.commit[0])
            tokens = inp.candidates if decision.tokens is None else decision.tokens
            one_tokens = one.candidates if one_decision.tokens is None else one_decision.tokens
            assert torch.equal(tokens[row][decision.commit[row]], one_tokens[0][one_decision.commit[0]])
            assert (decision.finish is None) == (one_decision.finish is None)
            if decision.finish is not None:
                assert bool(decision.finish[row]) == bool(one_decision.finish[0])
            if logits is not None:
                assert torch.allclose(logits[row], one_logits[0])
            if ends is not None:
                assert int(ends[row]) == int(one_ends[0])


@pytest.mark.parametrize("name", NAMES)
def test_same_generator_same_decision(name):
    scheduler = SCHEDULERS[name]()
    decisions = []
    for _ in range(2):
        state = scheduler.init_state(3, torch.device("cpu"))
        decisions.append(run_hooks(scheduler, random_input(11), state)[2].commit)
    assert torch.equal(decisions[0], decisions[1])


@pytest.mark.parametrize("name", NAMES)
def test_round_trips_through_component_dict_and_build(name):
    scheduler = SCHEDULERS[name]()
    described = json.loads(json.dumps(component_dict(scheduler)))
    assert described["name"] == name
    assert component("scheduler", described) == scheduler


@pytest.fixture(scope="module")
def model():
    return tiny_llada(seed=3)


@pytest.mark.parametrize("name", NAMES)
def test_generate_terminates_batched_equals_one_by_one_and_state_never_leaks(name, model):
    config = DecodeConfig(scheduler=SCHEDULERS[name](), gen_length=8, block_length=4)

    def run(prompts):
        return generate(model, prompts, config, generator=torch.Generator().manual_seed(0))

    batched = run(PROMPTS)
    assert not (batched.tokens == model.mask_token_id).any()
    post = config.scheduler.post_steps + 1 if config.scheduler.revises != "none" else 0
    ahead = 8 if config.scheduler.lookahead_candidates else 0   # a look-ahead call per step at most
    assert (batched.nfe >= 1).all() and (batched.nfe <= 8 + 2 * post + ahead).all()   # + post-fill passes per block
    again = run(PROMPTS)                                     # same instance, a new request
    assert torch.equal(batched.tokens, again.tokens) and torch.equal(batched.nfe, again.nfe)
    if name in DRAWS_RANDOM_SCORES:
        return
    for row, prompt in enumerate(PROMPTS):
        alone = run([prompt])
        assert torch.equal(batched.tokens[row], alone.tokens[0])
        assert batched.nfe[row] == alone.nfe[0]


@pytest.mark.parametrize("cache_name", ["prefix", "dual"])
@pytest.mark.parametrize("name", NAMES)
def test_generate_under_block_caches_terminates_and_repeats(name, cache_name, model):
    config = DecodeConfig(scheduler=SCHEDULERS[name](), gen_length=8, block_length=4)
    cache = CACHES[cache_name]()
    if not accepts_cache(config.scheduler, cache_name):  # e.g. takes back earlier blocks: no cache
        with pytest.raises(ValueError, match="use cache 'none'"):
            dataclasses.replace(config, cache=cache)
        return
    runs = [generate(model, PROMPTS, dataclasses.replace(config, cache=cache), generator=torch.Generator().manual_seed(0))
            for _ in range(2)]
    assert not (runs[0].tokens == model.mask_token_id).any()
    assert torch.equal(runs[0].tokens, runs[1].tokens) and torch.equal(runs[0].nfe, runs[1].nfe)
