"""The ideal analytic denoiser of ParallelBench §4 (Kang et al., 2025, arXiv 2510.04767).

For every masked answer position it returns the exact conditional marginal of the data
distribution, as log-probabilities, given the prompt and the answer tokens already committed on the
canvas. Per-token marginals are exact, so any loss of accuracy under parallel decoding comes from
the factorisation across positions alone: the quantity the closed forms of `formulas` describe.

Data distributions: deterministic ops (copy, sort, reverse, *_index, sudoku) put all mass on one
answer; shuffle is uniform over the n! permutations (the closed forms' model; ParallelBench's scorer also
rejects the identity, a 1/n! difference); insert/remove/replace_random are uniform over the
position; latin_square is uniform over all 576 squares on the given symbols. After the answer,
every position is EOS with probability 1. Committed tokens that no answer agrees with are ignored
(the marginal is then taken over every answer).

Canvas layout: `[left padding][prompt][answer canvas of gen_length]`, padding marked by
`attention_mask`; the model needs `gen_length` to know where the prompt ends, because committed
answer tokens are the same words as the prompt's items.

The model reads only the built-in tasks' compact prompts (`copy : alice bob`): one-token names
from the task vocabulary, no list punctuation. Any other prompt, ParallelBench's released files
with their two-word names and JSON-style lists included, is refused with a one-line ValueError
(`prompt_problem`, `check_prompts`) instead of being decoded into a meaningless 0%.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable

import torch
from torch import Tensor, nn

from dllm_decode.eval.tasks.parse import parse_prompt
from dllm_decode.eval.tasks.puzzles import all_latin_squares, solutions
from dllm_decode.eval.tasks.waiting_line import OPS
from dllm_decode.eval.tasks.tokenizer import EOS, MASK, PUNCTUATION, UNK, build_tokenizer, vocabulary

LOG_ZERO = -1e4
"""Log-probability of impossible tokens: exp() underflows to exactly 0 in float32."""

_CANDIDATE_OPS = {
    "insert_random": lambda xs, w: [xs[:j] + [w] + xs[j:] for j in range(len(xs) + 1)],
    "remove_random": lambda xs, w: [xs[:j] + xs[j + 1:] for j in range(len(xs))],
    "replace_random": lambda xs, w: [xs[:j] + [w] + xs[j + 1:] for j in range(len(xs))],
}


class IdealModel(nn.Module):
    """A `DiffusionLM` whose logits are the exact data marginals of the task suite.

    Args:
        gen_length: length of the answer canvas (the last `gen_length` columns of every row).
        noise: standard deviation of zero-mean Gaussian noise added to the log-probabilities
            (l_ideal + eps); any small value > 0 breaks exact ties at random, which
            the closed forms for greedy decoding assume. 0 keeps the logits exact.
        generator: source of that noise (seeded runs repeat).
    """

    supports_kv = False

    def __init__(self, gen_length: int, noise: float = 0.0, generator: torch.Generator | None = None):
        super().__init__()
        if gen_length < 1:
            raise ValueError(f"gen_length must be >= 1, got {gen_length}")
        if isinstance(noise, bool) or not isinstance(noise, (int, float)) or not math.isfinite(noise) \
                or noise < 0:
            raise ValueError(f"ideal: noise must be a finite number >= 0, got {noise!r}")
        self.vocab = vocabulary()
        self.words = {i: w for w, i in self.vocab.items()}
        self.gen_length = gen_length
        self.noise = noise
        self.generator = generator
        self.mask_token_id = self.vocab[MASK]
        self.eos_token_ids = (self.vocab[EOS],)
        self.vocab_size = len(self.vocab)
        self.max_length = None

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                positions: Tensor | None = None, kv=None,
                rows: tuple[int, int] | None = None) -> Tensor:
        """(B, L) canvas -> (B, L, V) float32 log-probabilities (rows `[a, b)` only if given).

        Prompt and committed positions get probability 1 on their own token.
        """
        batch, length = input_ids.shape
        g = self.gen_length
        if length <= g:
            raise ValueError(f"canvas length {length} leaves no prompt before gen_length {g}")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        probs = torch.zeros(batch, length, self.vocab_size)
        probs.scatter_(2, input_ids.cpu().unsqueeze(-1), 1.0)
        for b in range(batch):                 # parsing a prompt is per row by nature
            ids = input_ids[b].tolist()
            prompt = [t for t, m in zip(ids[:length - g], attention_mask[b, :length - g].tolist()) if m]
            probs[b, length - g:] = self.answer_marginals(tuple(prompt), tuple(ids[length - g:]))
        logits = torch.where(probs > 0, probs.log(), torch.full_like(probs, LOG_ZERO))
        if self.noise > 0:
            logits = logits + self.noise * torch.randn(logits.shape, generator=self.generator)
        if rows is not None:
            logits = logits[:, rows[0]:rows[1]]
        return logits.to(input_ids.device)

    def answer_marginals(self, prompt: tuple[int, ...], canvas: tuple[int, ...]) -> Tensor:
        """(G, V) probabilities of each canvas position given the prompt and committed tokens.

        Raises:
            ValueError: a prompt outside the model's vocabulary or format (`prompt_problem`).
        """
        words = [self.words.get(t, UNK) for t in prompt]
        if problem := _words_problem(words):
            raise ValueError(f"the ideal model cannot read this prompt: {problem}")
        name, meta = parse_prompt(" ".join(words))
        g = len(canvas)
        canvas_t = torch.tensor(canvas)
        masked = canvas_t == self.mask_token_id
        if name == "shuffle":
            return self._shuffle_marginals(meta["items"], canvas_t, masked)
        cands = self._candidates(name, meta, g)                         # (C, G) token ids
        consistent = ((cands == canvas_t) | masked).all(1)
        if consistent.any():
            cands = cands[consistent]
        probs = torch.nn.functional.one_hot(cands, self.vocab_size).float().mean(0)
        return torch.where(masked[:, None], probs, torch.nn.functional.one_hot(
            canvas_t, self.vocab_size).float())

    def _shuffle_marginals(self, items: list[str], canvas: Tensor, masked: Tensor) -> Tensor:
        # Uniform over permutations given the committed prefix set: each masked answer position is
        # uniform over the items not yet placed (n! answers is too many to enumerate at n = 12).
        n, g = len(items), canvas.numel()
        item_ids = torch.tensor([self.vocab[x] for x in items])
        placed = torch.isin(item_ids, canvas[:n][~masked[:n]])
        left = item_ids[~placed] if (~placed).any() else item_ids
        probs = torch.nn.functional.one_hot(canvas, self.vocab_size).float()
        answer_row = torch.zeros(self.vocab_size)
        answer_row[left] = 1.0 / left.numel()
        eos_row = torch.nn.functional.one_hot(torch.tensor(self.eos_token_ids[0]), self.vocab_size).float()
        position_rows = torch.where((torch.arange(g) < n)[:, None], answer_row, eos_row)
        return torch.where(masked[:, None], position_rows, probs)

    @functools.lru_cache(maxsize=4096)
    def _candidates_cached(self, name: str, key: tuple, g: int) -> Tensor:
        meta = dict(key)
        items, word = list(meta.get("items") or ()), meta.get("word")
        if name in _CANDIDATE_OPS:
            answers = _CANDIDATE_OPS[name](items, word)
        elif name == "latin_square":
            symbols = list(meta["symbols"])
            answers = [[symbols[d - 1] for d in square] for square in all_latin_squares()]
        elif name == "sudoku":
            found = solutions(tuple(meta["puzzle"]))
            answers = [[str(d) for d in grid] for grid in found[:1]]
        else:
            answers = [OPS[name].answer(None, items, word, meta.get("index"))]
        eos = self.eos_token_ids[0]
        rows = [[self.vocab.get(w, self.vocab["[UNK]"]) for w in a][:g] for a in answers]
        return torch.tensor([r + [eos] * (g - len(r)) for r in rows])

    def _candidates(self, name: str, meta: dict, g: int) -> Tensor:
        key = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in sorted(meta.items()))
        return self._candidates_cached(name, key, g)




def _words_problem(tokens: list[str], shown: list[str] | None = None) -> str | None:
    """Why a prompt of these tokens (`shown`: the same words as written, when known) is unreadable."""
    if shown is None and UNK in tokens:
        return f"its prompt holds {tokens.count(UNK)} word(s) outside its vocabulary"
    unknown = list(dict.fromkeys(w for t, w in zip(tokens, shown or tokens) if t == UNK))
    if unknown:
        listed = ", ".join(repr(w) for w in unknown[:4]) + (", ..." if len(unknown) > 4 else "")
        return (f"{listed} {'is' if len(unknown) == 1 else 'are'} not in its vocabulary (it knows "
                f"the built-in tasks' one-token names, not e.g. the released files' two-word ones)")
    if any(t in PUNCTUATION for t in tokens):
        return ("it reads the compact prompt format `<op> ... : item item ...`, not JSON-style "
                "lists like the released ParallelBench files")
    try:
        parse_prompt(" ".join(tokens))
    except ValueError as err:
        return str(err)
    return None


def prompt_problem(prompt: str) -> str | None:
    """Why the ideal model cannot read the prompt text `prompt` (None when it can)."""
    words = [w for w, _ in build_tokenizer().pre_tokenizer.pre_tokenize_str(prompt)]
    vocab = vocabulary()
    return _words_problem([w if w in vocab else UNK for w in words], words)


def check_prompts(task: str, prompts: Iterable[str]) -> None:
    """Refuse a task the ideal model cannot read, before anything is decoded.

    Raises:
        ValueError: one line naming the task, the first unreadable prompt's problem, and the way out.
    """
    for prompt in prompts:
        if problem := prompt_problem(prompt):
            raise ValueError(f"the ideal model cannot run task {task!r}: {problem}; it would "
                             f"score 0% without meaning it (use the built-in tasks, or a real model)")


IDEAL_OPTIONS = {"noise": float}
"""`ideal:KEY=VALUE` options of the model name (`dllm_decode.modelspec`)."""


def ideal_options(options: dict[str, str]) -> dict[str, float]:
    """Typed `ideal:` options. Raises ValueError on an unknown option or a value that does not parse."""
    out = {}
    for key, value in options.items():
        if key not in IDEAL_OPTIONS:
            raise ValueError(f"ideal: unknown option {key!r}; valid: {sorted(IDEAL_OPTIONS)}")
        try:
            out[key] = IDEAL_OPTIONS[key](value)
        except ValueError:
            raise ValueError(f"ideal: option {key}={value!r} must be a number") from None
    return out


def ideal_model(gen_length: int, options: dict[str, str] | None = None,
                generator: torch.Generator | None = None) -> IdealModel:
    """The ideal model for a canvas of `gen_length`, with the task suite's tokenizer attached."""
    from dllm_decode.eval.tasks.tokenizer import load_tokenizer

    model = IdealModel(gen_length, generator=generator, **ideal_options(options or {}))
    model.tokenizer = load_tokenizer()
    return model
