"""Training data shared by the diffusion and AR recipes: a seeded pool of train-split examples,
token ids, and the per-step batches (each step's batch is a pure function of (seed, step), so a
resumed run sees exactly the batches an uninterrupted run would)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from torch import Tensor

from dllm_decode.eval.tasks import LONG_LENGTHS, TASKS, WAITING_LINE, Example
from dllm_decode.eval.tasks.puzzles import cyclic_latin
from dllm_decode.eval.tasks.tokenizer import EOS, MASK, PAD, SEPARATOR, vocabulary
from dllm_decode.eval.tasks.vocab import SYMBOLS
from dllm_decode.eval.tasks.waiting_line import ListTask

VOCAB = vocabulary()
PAD_ID, EOS_ID, MASK_ID, SEP_ID = VOCAB[PAD], VOCAB[EOS], VOCAB[MASK], VOCAB[SEPARATOR]
SHORT_LENGTHS = (3, 6)


def encode(text: str) -> list[int]:
    """Token ids of space-separated task text (the tokenizer's result, without its overhead)."""
    return [VOCAB[word] for word in text.split()]


@dataclass(frozen=True)
class Pool:
    """Encoded train examples: per example the prompt ids and the answer ids (no EOS)."""

    prompts: list[list[int]]
    answers: list[list[int]]

    def __len__(self) -> int:
        return len(self.prompts)


LATIN_TARGETS = ("shuffled", "canonical")
SYMBOL_LIST_TASKS = tuple(name for name in WAITING_LINE if name != "sort")
"""The list ops whose `symbol_share` is drawn over the Latin symbols. Sort is left out: no test
task sorts symbols, and its name examples are where sort accuracy is borderline."""


def build_pool(per_task: int, seed: int = 0, long_share: float = 0.25,
               latin_target: str = "shuffled", symbol_share: float = 0.0,
               latin_weight: float = 1.0) -> Pool:
    """`per_task` train examples of every task; a `long_share` of each list task's examples use
    the long lengths (8-12), the rest ParallelBench's 3-6.

    `latin_target`: the Latin-square answer trained on. `shuffled` is ParallelBench's reference
    (a cyclic square with shuffled rows and columns: 144 equally likely squares per prompt);
    `canonical` is the one cyclic square in prompt order (row r = the symbols rotated by r),
    a deterministic answer that is just as valid under the any-valid-square metric.

    `symbol_share`: that share of each `SYMBOL_LIST_TASKS` op's examples lists the 36 Latin
    symbols (`vocab.SYMBOLS`, as ParallelBench's letter lists) instead of names, e.g.
    `copy : A 7 K Q`, with the same short/long split. Otherwise those symbols occur only in Latin
    prompts and the model never learns to copy them by position (it cannot even copy them, so
    no Latin target is reachable). They are the op's own train split (`Task.examples` keeps
    only prompts that `split_of(op, prompt)` puts in train), so they never meet a test instance,
    whichever item pool a test set draws from.

    `latin_weight`: the pool holds `round(per_task * latin_weight)` Latin-square examples (more
    distinct prompts and a larger share of every batch than the other tasks' `per_task`).
    """
    if latin_target not in LATIN_TARGETS:
        raise ValueError(f"latin_target must be one of {LATIN_TARGETS}, got {latin_target!r}")
    if not 0.0 <= symbol_share <= 1.0 or latin_weight < 0:
        raise ValueError(f"need 0 <= symbol_share <= 1 and latin_weight >= 0, "
                         f"got {symbol_share} and {latin_weight}")
    examples: list[Example] = []
    for name, task in TASKS.items():
        if name == "latin_square":
            examples += task.examples("train", round(per_task * latin_weight), seed)
            continue
        n_symbols = round(per_task * symbol_share) if name in SYMBOL_LIST_TASKS else 0
        sources = [(task, per_task - n_symbols)]
        if n_symbols:
            sources.append((ListTask(name, SYMBOLS), n_symbols))
        for source, n in sources:
            n_long = int(n * long_share) if name in WAITING_LINE else 0
            if n - n_long:
                examples += source.examples("train", n - n_long, seed, lengths=SHORT_LENGTHS)
            if n_long:
                examples += source.examples("train", n_long, seed, lengths=LONG_LENGTHS)
    return Pool([encode(e.prompt) for e in examples],
                [encode(_trained_answer(e, latin_target)) for e in examples])


def _trained_answer(example: Example, latin_target: str) -> str:
    if example.task == "latin_square" and latin_target == "canonical":
        return " ".join(cyclic_latin(example.meta["symbols"]))
    return example.answer


def step_rng(seed: int, step: int) -> tuple[random.Random, torch.Generator]:
    """The Python and torch generators of one training step."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return random.Random(f"{seed}|{step}"), gen


@dataclass(frozen=True)
class DiffusionBatch:
    """One masked-diffusion batch, rows laid out `[left pad][prompt][canvas]`.

    Attributes:
        input_ids: (B, L) long, canvas positions replaced by the mask token where `masked`.
        targets: (B, L) long clean tokens (answer, then EOS up to the canvas end).
        attention_mask: (B, L) long, 0 on left padding.
        masked: (B, L) bool, positions whose loss counts (only ever inside the canvas).
        weight: (B, L) float, 1 / (t * canvas length) on masked positions (LLaDA SFT), else 0.
    """

    input_ids: Tensor
    targets: Tensor
    attention_mask: Tensor
    masked: Tensor
    weight: Tensor


SEMI_AR_BLOCKS = (8, 16, 32, 64)
"""Block lengths whose decoding states `semi_ar_share` rows imitate."""


def diffusion_batch(pool: Pool, batch_size: int, canvas: int | None, rng: random.Random,
                    gen: torch.Generator, eps: float = 1e-3, semi_ar_share: float = 0.0) -> DiffusionBatch:
    """Sample a batch and mask it. `canvas` None: the longest answer + EOS + 0..8 extra EOS.

    LLaDA SFT: the answer is EOS-padded to the canvas length and the EOS tail is part of the
    masked target; t ~ U(eps, 1) per row; each canvas token is masked with probability t; the
    prompt is never masked.

    Deviation (`semi_ar_share` > 0): that share of rows is masked the way semi-autoregressive
    decoding sees the canvas instead: a block length s from `SEMI_AR_BLOCKS` and a block j that
    overlaps the answer or its first EOS; columns before the block are clean, the block is
    masked at rate t, everything after it is masked. Uniform masking almost never shows a long
    canvas whose whole tail is masked, yet that is every state of block 1 at gen 256/512.
    Tail positions are weighted as t = 1.
    """
    idx = [rng.randrange(len(pool)) for _ in range(batch_size)]
    prompts = [pool.prompts[i] for i in idx]
    answers = [pool.answers[i] for i in idx]
    longest = max(len(a) for a in answers) + 1
    g = max(canvas or 0, longest) if canvas else longest + rng.randint(0, 8)
    p = max(len(x) for x in prompts)
    rows = [[PAD_ID] * (p - len(x)) + x + a + [EOS_ID] * (g - len(a)) for x, a in zip(prompts, answers)]
    targets = torch.tensor(rows)
    attention_mask = (torch.arange(p + g) >= torch.tensor([p - len(x) for x in prompts])[:, None]).long()
    t = eps + (1 - eps) * torch.rand(batch_size, 1, generator=gen)
    col = torch.arange(p + g) - p                       # canvas column (negative in the prompt)
    start, end = torch.zeros(batch_size, 1, dtype=torch.long), torch.full((batch_size, 1), g)
    for r, a in enumerate(answers):
        if rng.random() < semi_ar_share:
            s = rng.choice(SEMI_AR_BLOCKS)
            start[r] = s * rng.randrange(len(a) // s + 1)
            end[r] = start[r] + s
    in_block = (col >= start) & (col < end)
    masked = ((torch.rand(batch_size, p + g, generator=gen) < t) & in_block) | (col >= end)
    input_ids = torch.where(masked, MASK_ID, targets)
    rate = torch.where(in_block, t, torch.ones_like(t))
    weight = masked.float() / (rate * g)
    return DiffusionBatch(input_ids, targets, attention_mask, masked, weight)


@dataclass(frozen=True)
class CausalBatch:
    """`prompt = answer EOS` right-padded; `labels` is -100 except on answer and EOS tokens."""

    input_ids: Tensor
    attention_mask: Tensor
    labels: Tensor


def causal_batch(pool: Pool, batch_size: int, rng: random.Random) -> CausalBatch:
    """Sample a next-token-prediction batch (loss on the answer and its EOS only)."""
    idx = [rng.randrange(len(pool)) for _ in range(batch_size)]
    seqs, labels = [], []
    for i in idx:
        prompt = pool.prompts[i] + [SEP_ID]
        answer = pool.answers[i] + [EOS_ID]
        seqs.append(prompt + answer)
        labels.append([-100] * len(prompt) + answer)
    width = max(len(s) for s in seqs)
    pad = [width - len(s) for s in seqs]
    return CausalBatch(
        torch.tensor([s + [PAD_ID] * k for s, k in zip(seqs, pad)]),
        torch.tensor([[1] * len(s) + [0] * k for s, k in zip(seqs, pad)]),
        torch.tensor([lab + [-100] * k for lab, k in zip(labels, pad)]),
    )
