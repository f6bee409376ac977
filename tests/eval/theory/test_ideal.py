"""The ideal analytic model: its marginals directly, then the spec's closed forms (parallelbench.md
§2.2) reproduced through the real sampler.

Statistical tolerance: a run of N seeded samples estimates an accuracy p with binomial standard
error sqrt(p (1 - p) / N); the closed-form tests accept |measured - p| <= 4 standard errors
(two-sided false-alarm rate about 6e-5 if the sampler is right), and exact values where p is 0 or 1.
"""

from __future__ import annotations

import math

import pytest
import torch

from dllm_decode import generate
from dllm_decode.config import DecodeConfig
from dllm_decode.eval.theory.ideal import IdealModel
from dllm_decode.eval.tasks import TASKS
from dllm_decode.eval.tasks.waiting_line import _is_replace
from tests.eval.theory.words import encode
from dllm_decode.schedulers import LowConfidenceScheduler, ThresholdScheduler


def marginals(model: IdealModel, prompt: str, canvas: list[str | None]) -> list[dict[str, float]]:
    """Per canvas position, {word: probability} for words with probability > 1e-6."""
    ids = encode(prompt) + [model.mask_token_id if w is None else model.vocab[w] for w in canvas]
    probs = model(torch.tensor([ids]))[0, -len(canvas):].softmax(-1)
    return [{model.words[i]: round(row[i].item(), 4) for i in (row > 1e-6).nonzero().flatten().tolist()}
            for row in probs]


EOS = "<|endoftext|>"


def test_shuffle_is_uniform_over_unplaced_items_then_eos():
    model = IdealModel(5)
    third = round(1 / 3, 4)
    assert marginals(model, "shuffle : alice bob carol", [None] * 5) == (
        [{"alice": third, "bob": third, "carol": third}] * 3 + [{EOS: 1.0}] * 2)
    got = marginals(model, "shuffle : alice bob carol", [None, "bob", None, None, None])
    assert got[0] == got[2] == {"alice": 0.5, "carol": 0.5}
    assert got[1] == {"bob": 1.0}


def test_replace_random_follows_the_spec():
    model = IdealModel(3)
    third, two_thirds = round(1 / 3, 4), round(2 / 3, 4)
    assert marginals(model, "replace with dan : alice bob carol", [None] * 3) == [
        {"alice": two_thirds, "dan": third}, {"bob": two_thirds, "dan": third},
        {"carol": two_thirds, "dan": third}]
    # the new item is placed: every other position keeps its item
    assert marginals(model, "replace with dan : alice bob carol", ["dan", None, None])[1:] == [
        {"bob": 1.0}, {"carol": 1.0}]
    # one position kept: the new item is at one of the remaining two
    assert marginals(model, "replace with dan : alice bob carol", ["alice", None, None])[1:] == [
        {"bob": 0.5, "dan": 0.5}, {"carol": 0.5, "dan": 0.5}]


@pytest.mark.parametrize("name", ["copy", "sort", "reverse", "insert_index", "remove_index",
                                  "replace_index", "sudoku"])
def test_deterministic_tasks_put_all_mass_on_the_answer(name):
    for ex in TASKS[name].examples("test", 4, 0):
        g = len(ex.answer.split()) + 2
        got = marginals(IdealModel(g), ex.prompt, [None] * g)
        assert got == [{w: 1.0} for w in ex.answer.split()] + [{EOS: 1.0}] * 2


def test_insert_and_remove_random_marginals():
    model = IdealModel(3)
    got = marginals(model, "insert dan : alice bob", [None] * 3)
    assert got[0] == {"alice": round(2 / 3, 4), "dan": round(1 / 3, 4)}
    assert got[1] == {"alice": round(1 / 3, 4), "bob": round(1 / 3, 4), "dan": round(1 / 3, 4)}
    got = marginals(IdealModel(3), "remove : alice bob carol", [None, "carol", None])
    assert got[0] == {"alice": 0.5, "bob": 0.5} and got[2] == {EOS: 1.0}


def test_latin_square_first_cell_uniform_and_committed_cells_constrain():
    model = IdealModel(16)
    got = marginals(model, "latin : A B C D", [None] * 16)
    assert got[0] == {s: 0.25 for s in "ABCD"}
    got = marginals(model, "latin : A B C D", ["A", "B", "C"] + [None] * 13)
    assert got[3] == {"D": 1.0}                  # the row's last symbol is forced
    assert "A" not in got[4]                     # column 0 already holds A


def test_inconsistent_commits_fall_back_and_shapes_follow_rows():
    model = IdealModel(3)
    ids = torch.tensor([encode("copy : alice bob carol") + [model.vocab["wendy"]] + [model.mask_token_id] * 2])
    logits = model(ids)
    assert logits.shape == (1, ids.shape[1], model.vocab_size) and logits.dtype == torch.float32
    assert model(ids, rows=(ids.shape[1] - 3, ids.shape[1])).shape == (1, 3, model.vocab_size)
    assert logits[0, -1].argmax().item() == model.vocab["carol"]
    with pytest.raises(ValueError, match="gen_length"):
        IdealModel(0)


def test_left_padding_is_ignored():
    model = IdealModel(4)
    prompt = encode("reverse : alice bob carol")
    canvas = [model.mask_token_id] * 4
    padded = torch.tensor([[0, 0] + prompt + canvas])
    mask = torch.tensor([[0, 0] + [1] * (len(prompt) + 4)])
    assert torch.equal(model(padded, attention_mask=mask)[:, 2:], model(torch.tensor([prompt + canvas])))


# ---- closed forms through the real sampler (dllm_decode.generate) -------------------------------

def _decode(prompts: list[str], gen_length: int, scheduler, temperature: float = 0.0,
            seed: int = 0) -> list[list[str]]:
    gen = torch.Generator().manual_seed(seed)
    model = IdealModel(gen_length, noise=1e-3, generator=gen)   # noise breaks exact ties at random
    config = DecodeConfig(scheduler=scheduler, gen_length=gen_length, block_length=gen_length,
                          temperature=temperature)
    result = generate(model, [encode(p) for p in prompts], config, generator=gen)
    return [[model.words[t] for t in row if t not in model.eos_token_ids] for row in result.tokens.tolist()]


def _within(successes: int, n: int, p: float) -> bool:
    if p in (0.0, 1.0):
        return successes == round(p * n)
    return abs(successes / n - p) <= 4 * math.sqrt(p * (1 - p) / n)


def shuffle_accuracy(n: int, k: int) -> float:
    """Spec Eq. 5: prod over steps of P(m, k) / m^k, m the items still unplaced."""
    return math.prod(math.perm(m, k) / m ** k for m in range(n, 0, -k))


@pytest.mark.slow
@pytest.mark.parametrize("n, k", [(4, 1), (4, 2), (4, 4), (6, 2), (6, 3)])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_shuffle_top_k_matches_closed_form(n, k, temperature, samples=300):
    names = TASKS["shuffle"].examples("test", samples, 0, lengths=(n, n))
    outputs = _decode([e.prompt for e in names], n, LowConfidenceScheduler(steps_per_block=n // k),
                      temperature)
    # the closed form counts any permutation (the data model includes the identity)
    ok = sum(sorted(out) == sorted(e.meta["items"]) for e, out in zip(names, outputs))
    p = shuffle_accuracy(n, k)
    assert _within(ok, samples, p), (ok / samples, p)


def test_shuffle_closed_form_special_cases():
    assert shuffle_accuracy(4, 2) == pytest.approx(0.375)            # (n-1)!!/n!!
    assert shuffle_accuracy(4, 4) == pytest.approx(math.factorial(4) / 4 ** 4)
    assert shuffle_accuracy(6, 2) == pytest.approx(0.3125)


@pytest.mark.slow
@pytest.mark.parametrize("n, k, p", [(4, 2, 0.5), (4, 4, 0.0), (6, 3, 0.0), (4, 1, 1.0)])
def test_replace_random_greedy_matches_closed_form(n, k, p, samples=300):
    examples = TASKS["replace_random"].examples("test", samples, 0, lengths=(n, n))
    outputs = _decode([e.prompt for e in examples], n, LowConfidenceScheduler(steps_per_block=n // k))
    ok = sum(_is_replace(e.meta["items"], e.meta["word"], None, out) for e, out in zip(examples, outputs))
    assert _within(ok, samples, p), (ok / samples, p)


def test_closed_forms_quick():
    """The default-suite subset of the two slow sweeps above, with fewer samples (wider bounds)."""
    test_shuffle_top_k_matches_closed_form(4, 2, 0.0, samples=120)
    test_replace_random_greedy_matches_closed_form(4, 2, 0.5, samples=120)


@pytest.mark.slow
def test_replace_random_one_step_sampling_is_about_one_over_e():
    n, samples = 4, 400
    examples = TASKS["replace_random"].examples("test", samples, 1, lengths=(n, n))
    outputs = _decode([e.prompt for e in examples], n, LowConfidenceScheduler(steps_per_block=1),
                      temperature=1.0)
    ok = sum(_is_replace(e.meta["items"], e.meta["word"], None, out) for e, out in zip(examples, outputs))
    assert _within(ok, samples, ((n - 1) / n) ** (n - 1)), ok / samples


@pytest.mark.parametrize("gamma", [0.6, 0.9])
def test_threshold_above_one_half_solves_shuffle(gamma):
    examples = TASKS["shuffle"].examples("test", 40, 2, lengths=(3, 6))
    outputs = _decode([e.prompt for e in examples], 8, ThresholdScheduler(threshold=gamma))
    assert all(sorted(out) == sorted(e.meta["items"]) for e, out in zip(examples, outputs))


def test_prompts_outside_the_vocabulary_are_refused_not_scored_zero():
    from dllm_decode.eval.theory.ideal import check_prompts, prompt_problem

    assert prompt_problem("replace with dan : alice bob carol") is None
    assert "'Billy', 'Ramos'" in prompt_problem('copy : ["Billy Ramos", "Alan Wells"]')
    assert "JSON-style" in prompt_problem('copy : ["alice", "bob"]')     # known names, released format
    with pytest.raises(ValueError, match="released/copy.*Billy"):
        check_prompts("released/copy", ["copy : alice", 'copy : ["Billy Ramos"]'])
    model = IdealModel(3)
    unk = model.vocab["[UNK]"]
    ids = torch.tensor([encode("copy : alice") + [unk] + [model.mask_token_id] * 3])
    with pytest.raises(ValueError, match="outside its vocabulary"):
        model(ids)


def test_decode_cli_refuses_an_unreadable_ideal_prompt():
    from click.testing import CliRunner

    from dllm_decode.cli import main

    result = CliRunner().invoke(main, ["--model", "ideal", "--gen-length", "4", "--block-length", "4",
                                       "--prompt", "copy : Billy Ramos"])
    assert result.exit_code == 2 and "vocabulary" in result.output, result.output
