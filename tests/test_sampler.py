"""The one loop: invariants, batching, seeds, EOS policy, trace, errors."""

import dataclasses

import pytest
import torch

from dllm_decode import DecodeConfig, generate
from dllm_decode.interfaces import Decision, NoCache, Scheduler, StepInput
from dllm_decode.testing import OracleMaskPredictor, tiny_llada
from dllm_decode.schedulers import LowConfidenceScheduler, ThresholdScheduler

VOCAB, MASK, EOS = 37, 36, 35


def oracle(target, confidence):
    return OracleMaskPredictor(torch.tensor(target), torch.tensor(confidence), VOCAB, MASK, EOS)


def config(scheduler=None, gen=12, block=4, **kw):
    return DecodeConfig(scheduler=scheduler or ThresholdScheduler(), gen_length=gen, block_length=block, **kw)


def test_threshold_commits_exactly_the_confident_positions_then_the_best_one():
    model = oracle([3, 4, 5, 6], [0.95, 0.5, 0.99, 0.6])
    result = generate(model, [[1, 2]], config(gen=4, block=4), trace=True)
    commits = [step["commit"][0].nonzero().flatten().tolist() for step in result.trace]
    assert commits == [[0, 2], [3], [1]]        # >= 0.9 first, then forced argmax one at a time
    assert result.tokens[0].tolist() == [3, 4, 5, 6]
    assert result.nfe.tolist() == [3]


def test_low_confidence_one_token_per_step_takes_gen_length_steps():
    model = oracle(list(range(1, 13)), [0.5 + 0.01 * i for i in range(12)])
    result = generate(model, [[1]], config(LowConfidenceScheduler(), gen=12, block=4, stop_at_eos=False))
    assert result.nfe.tolist() == [12]
    assert result.tokens_per_step.tolist() == [1.0]


def test_low_confidence_steps_per_block_front_loads_the_remainder():
    model = oracle(list(range(1, 11)), [0.5] * 10)
    result = generate(model, [[1]], config(LowConfidenceScheduler(steps_per_block=4), gen=10, block=10),
                      trace=True)
    assert [int(step["commit"].sum()) for step in result.trace] == [3, 3, 2, 2]


def test_mask_predictions_are_never_committed():
    model = oracle([MASK, 4, 5, 6], [0.99, 0.2, 0.2, 0.2])
    result = generate(model, [[1, 2]], config(gen=4, block=4))
    assert MASK not in result.tokens[0].tolist()


def test_batched_with_left_padding_equals_one_by_one():
    model = tiny_llada(seed=3)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10]]
    cfg = config(gen=16, block=8)
    batched = generate(model, prompts, cfg)
    for row, prompt in enumerate(prompts):
        alone = generate(model, [prompt], cfg)
        assert torch.equal(batched.tokens[row], alone.tokens[0])
        assert batched.nfe[row] == alone.nfe[0]


def test_seeded_sampling_repeats_and_seeds_differ():
    model = tiny_llada(seed=1)
    cfg = config(gen=16, block=8, temperature=1.0)
    runs = [generate(model, [[1, 2, 3]], cfg, generator=torch.Generator().manual_seed(s)).tokens
            for s in (7, 7, 8)]
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])


def test_eos_in_a_finished_block_fills_the_rest_and_stops_the_row():
    ends = oracle([3, EOS, 5, 6, 7, 8, 9, 10], [0.5] * 8)
    result = generate(ends, [[1, 2], [1, 2, 3]], config(LowConfidenceScheduler(), gen=8, block=4))
    assert result.tokens[0].tolist() == [3, EOS, 5, 6] + [EOS] * 4   # the block stays, the rest is EOS
    assert result.nfe.tolist() == [4, 4]                 # the second block never ran
    assert result.answer_lengths.tolist() == [1, 1]
    no_stop = generate(ends, [[1, 2]], config(LowConfidenceScheduler(), gen=8, block=4, stop_at_eos=False))
    assert no_stop.nfe.tolist() == [8] and no_stop.tokens[0, 2:].tolist() == [5, 6, 7, 8, 9, 10]


class _EndsWhenPromptStartsWithOne(torch.nn.Module):
    """tiny_llada, except that rows whose prompt starts with token 1 predict EOS everywhere."""

    def __init__(self):
        super().__init__()
        self.inner = tiny_llada(seed=5)
        self.mask_token_id, self.eos_token_ids = MASK, (EOS,)
        self.vocab_size, self.max_length = VOCAB, None

    def forward(self, input_ids, attention_mask=None, positions=None, kv=None, rows=None):
        logits = self.inner(input_ids, attention_mask, positions, kv=kv, rows=rows)
        first = input_ids.gather(1, (input_ids == EOS).long().argmin(-1, keepdim=True))  # skip padding
        return logits + 100.0 * torch.nn.functional.one_hot(torch.tensor(EOS), VOCAB) * (first == 1)[..., None]


def test_rows_finishing_early_land_in_their_own_slots():
    """Rows 1 and 3 finish in their first block, row 2 last; every row must still equal its
    decode alone, in its own slot."""
    model = _EndsWhenPromptStartsWithOne()
    prompts = [[4, 5], [1, 2], [6, 7, 8], [1]]
    cfg = config(LowConfidenceScheduler(), gen=16, block=4)
    batched = generate(model, prompts, cfg)
    assert batched.nfe[1] == batched.nfe[3] == 4 and batched.nfe[2] > 4
    for row, prompt in enumerate(prompts):
        alone = generate(model, [prompt], cfg)
        assert torch.equal(batched.tokens[row], alone.tokens[0]), row
        assert batched.nfe[row] == alone.nfe[0]


@dataclasses.dataclass(frozen=True)
class _CommitNothing(Scheduler):
    def select(self, inp: StepInput, state):
        return Decision(commit=torch.zeros_like(inp.eligible)), state


@dataclasses.dataclass(frozen=True)
class _CommitEverywhere(Scheduler):
    def select(self, inp: StepInput, state):
        return Decision(commit=torch.ones_like(inp.eligible)), state


def test_loop_forces_progress_for_a_scheduler_that_never_commits():
    result = generate(tiny_llada(), [[1, 2]], config(_CommitNothing(), gen=8, block=4))
    assert result.nfe.tolist() == [8] and not (result.tokens == MASK).any()


def test_loop_keeps_commits_inside_the_active_block():
    result = generate(tiny_llada(), [[1, 2]], config(_CommitEverywhere(), gen=8, block=4), trace=True)
    assert result.nfe.tolist() == [2]
    first = result.trace[0]["commit"][0]
    assert first[:4].all() and not first[4:].any()


def test_committed_tokens_never_change():
    result = generate(tiny_llada(seed=2), [[1, 2]], config(gen=8, block=8), trace=True)
    seen = {}
    for step in result.trace:
        for pos in step["commit"][0].nonzero().flatten().tolist():
            assert pos not in seen
            seen[pos] = int(step["tokens"][0, pos])
    assert sorted(seen) == list(range(8))
    assert [seen[p] for p in range(8)] == result.tokens[0].tolist()


@pytest.mark.parametrize("bad, message", [
    (dict(gen_length=10, block_length=4), "multiple of block_length"),
    (dict(gen_length=0), "gen_length"),
    (dict(block_length=64, gen_length=32), "block_length"),
    (dict(temperature=-1.0), "temperature"),
])
def test_config_rejects_bad_values(bad, message):
    with pytest.raises(ValueError, match=message):
        DecodeConfig(scheduler=ThresholdScheduler(), **bad)


def test_prompt_errors_are_clear():
    model = tiny_llada(max_length=20)
    with pytest.raises(ValueError, match="empty"):
        generate(model, [[]], config(gen=8, block=4))
    with pytest.raises(ValueError, match="exceeds the model's context of 20"):
        generate(model, [list(range(1, 16))], config(gen=8, block=4))
    with pytest.raises(ValueError, match="tokenizer"):
        generate(model, ["hello"], config(gen=8, block=4))


class _EosFromPosition(torch.nn.Module):
    """tiny_llada that predicts EOS confidently at every position >= `at` (positions count real
    tokens from the left), recording the canvas width of every forward."""

    def __init__(self, at: int, trimmable: bool):
        super().__init__()
        self.inner = tiny_llada(seed=6)
        self.at, self.trimmable, self.widths = at, trimmable, []
        self.mask_token_id, self.eos_token_ids = MASK, (EOS,)
        self.vocab_size, self.max_length, self.supports_kv = VOCAB, None, True

    def forward(self, input_ids, attention_mask=None, positions=None, kv=None, rows=None):
        self.widths.append(input_ids.shape[1])
        logits = self.inner(input_ids, attention_mask, positions, kv=kv, rows=rows)
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        where = (mask.cumsum(-1) - 1 >= self.at)[:, slice(*(rows or (0, input_ids.shape[1])))]
        return logits + 50.0 * torch.nn.functional.one_hot(torch.tensor(EOS), VOCAB) * where[..., None]


@pytest.mark.parametrize("cache", ["none", "dual"])
def test_truncated_tails_leave_the_canvas_exactly(cache):
    """After end-of-text truncation the model sees a narrower canvas; the output is the same as
    when the dead columns stay in place (they were masked out of attention)."""
    from dllm_decode.caches import CACHES
    from dllm_decode.filters import EoTPFilter

    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    cfg = config(LowConfidenceScheduler(steps_per_block=2), gen=24, block=8)
    cfg = dataclasses.replace(cfg, filters=(EoTPFilter(mode="predicted", eos_threshold=0.5),),
                              cache=CACHES[cache](refresh_every=1) if cache != "none" else CACHES[cache]())
    trimmed, kept = _EosFromPosition(8, trimmable=True), _EosFromPosition(8, trimmable=False)
    a, b = generate(trimmed, prompts, cfg), generate(kept, prompts, cfg)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.nfe, b.nfe)
    assert min(trimmed.widths) < max(trimmed.widths) == min(kept.widths) == max(kept.widths)
    assert (a.tokens[:, 8:] == EOS).all()


@pytest.mark.parametrize("prompts, error, fragment", [
    ("w1 w2", TypeError, "wrap a single prompt in a list"),
    (5, TypeError, "list of strings or token-id lists"),
    ([[1.5]], TypeError, "token ids must be integers"),
    ([[True]], TypeError, "token ids must be integers"),
    ([None], TypeError, "prompt 0 must be a string"),
    ([[99]], ValueError, "outside the vocabulary [0, 37)"),
    ([[-1]], ValueError, "outside the vocabulary"),
    ([[MASK]], ValueError, "[MASK] id"),
    (torch.randn(2, 3), TypeError, "integer ids"),
])
def test_bad_prompts_are_named_errors(prompts, error, fragment):
    with pytest.raises(error) as raised:
        generate(tiny_llada(), prompts, config(gen=8, block=4))
    assert fragment in str(raised.value)


def test_bad_arguments_are_type_errors_naming_the_argument():
    model = tiny_llada()
    with pytest.raises(TypeError, match="config must be a DecodeConfig"):
        generate(model, [[1]], {"scheduler": "threshold"})
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        generate(model, [[1]], config(gen=8, block=4), generator=3)
    with pytest.raises(TypeError, match="lacks"):
        generate("embedded", [[1]], config(gen=8, block=4))


def test_non_finite_logits_are_reported_as_a_model_problem():
    from dllm_decode import NonFiniteLogits

    model = tiny_llada()
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))
    with pytest.raises(NonFiniteLogits, match="NaN or infinite logits.*not the scheduler"):
        generate(model, [[1, 2]], config(gen=8, block=4))


def test_automatic_keys_are_never_reused_after_results_are_taken():
    from dllm_decode.sampler import Decoding

    decoding = Decoding(tiny_llada(), NoCache())
    keys = []
    for _ in range(4):                      # add, finish, hand over, add again: every key is new
        key = decoding.add([[1, 2]], config(gen=4, block=4))
        keys.append(key)
        while not decoding.finished:
            decoding.step()
        decoding.result(key)
    assert len(set(keys)) == 4
    decoding.add([[3]], config(gen=4, block=4), key=99)
    assert decoding.add([[3]], config(gen=4, block=4)) not in {99, *keys}


def test_a_second_thread_stepping_the_same_decoding_is_refused():
    import threading

    from dllm_decode.sampler import Decoding

    inner, entered, release = tiny_llada(), threading.Event(), threading.Event()

    class Slow(torch.nn.Module):
        mask_token_id, eos_token_ids = inner.mask_token_id, inner.eos_token_ids
        vocab_size, max_length = inner.vocab_size, inner.max_length

        def forward(self, *args, **kwargs):
            entered.set()
            release.wait(10)
            return inner(*args, **kwargs)

    decoding = Decoding(Slow(), NoCache())
    decoding.add([[1, 2]], config(gen=4, block=4))
    worker = threading.Thread(target=decoding.step)
    worker.start()
    assert entered.wait(10)
    try:
        for call in (decoding.step, lambda: decoding.add([[1]], config(gen=4, block=4)),
                     lambda: decoding.cancel(0)):
            with pytest.raises(RuntimeError, match="in use by another thread"):
                call()
    finally:
        release.set()
        worker.join()
    while not decoding.finished:             # the owner's decode is unharmed
        decoding.step()
    assert torch.equal(decoding.result(0).tokens, generate(inner, [[1, 2]], config(gen=4, block=4)).tokens)


@pytest.mark.parametrize("bad", [5.7, "5", True, None, 2 ** 70])
def test_token_ids_must_be_integers_at_every_entry_point(bad):
    from dllm_decode.engine import Engine, Request
    from dllm_decode.likelihood import loglikelihood
    from dllm_decode.reference import reference_generate
    from dllm_decode.sampler import Decoding

    model = tiny_llada()
    with pytest.raises((TypeError, ValueError), match="token id|integer"):
        generate(model, [[1, bad]], config(gen=4, block=4))
    with pytest.raises((TypeError, ValueError), match="token id|integer"):
        Decoding(model, NoCache()).add([[bad, 1]], config(gen=4, block=4))
    with pytest.raises((TypeError, ValueError), match="token id|integer"):
        Engine(model).add(Request("r", (1, bad), config(gen=4, block=4)))
    with pytest.raises((TypeError, ValueError), match="token id|integer"):
        reference_generate(model, [1, bad], config(gen=4, block=4))
    with pytest.raises((TypeError, ValueError), match="token id|integer"):
        loglikelihood(model, [1], [2, bad], mc_num=4, mc_batch=4)
