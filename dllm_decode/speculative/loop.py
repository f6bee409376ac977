"""`speculative_generate`: the autoregressive draft-then-verify loop (batch size 1).

Per round: the drafter proposes up to k levels, a chain or a token tree (`tree.py`), the
scheduler decides how many levels to verify (`schedule.draft_length`, shown the tree's spine),
one target forward scores every node (a tree under its tree mask), verification appends the
accepted path plus one target token, and the target's KV cache is cut back to the accepted
context (a tree's path gathered into place). A chain is the width-1 tree: the same round, with
the mask and the gather skipped. Without a drafter every round is one plain AR step, which is
the baseline the speedups are measured against.

Batch size 1 only, as HF assisted generation ("assisted generate is only supported for
batch_size = 1"): per-row acceptance makes the caches ragged.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import Tensor

from dllm_decode.fields import check_types
from dllm_decode.interfaces import Scheduler
from dllm_decode.prompts import encode_prompts
from dllm_decode.speculative.drafters.base import Draft, Drafter
from dllm_decode.speculative.kv import KV, extend, keep_path, new_kv
from dllm_decode.speculative.sampling import Sampling
from dllm_decode.speculative.schedule import (DraftLengthScheduler, EarlyStop, check_scheduler,
                                              draft_length)
from dllm_decode.speculative.verify import greedy_tree, sample_tree


@dataclass(frozen=True)
class SpecConfig:
    """One speculative decoding configuration (change with `dataclasses.replace`).

    Attributes:
        scheduler: decides each round's draft length (see `dllm_decode.speculative.schedule`).
        max_new_tokens: generation budget.
        max_draft: k, the most tokens drafted per round (HF `num_assistant_tokens`; HF's default
            is 20, ours 8 because small CPU targets gain little from longer windows).
        sampling: temperature/top-k/top-p of the target (and of a model drafter).
        stop_at_eos: stop after the first end-of-text token.
        early_stop: a drafter that drafts token by token stops as soon as the scheduler would
            cut before its newest token (`schedule.EarlyStop`; HF's confidence-threshold
            stopping). Saves the draft forwards a cut would discard; drafts can only get shorter.
    """

    scheduler: Scheduler
    max_new_tokens: int = 64
    max_draft: int = 8
    sampling: Sampling = field(default_factory=Sampling)
    stop_at_eos: bool = True
    early_stop: bool = True

    def __post_init__(self) -> None:
        check_scheduler(self.scheduler)
        check_types(self)
        if not isinstance(self.sampling, Sampling):
            raise TypeError(f"SpecConfig.sampling must be a Sampling, got {type(self.sampling).__name__} "
                            f"{self.sampling!r}")
        if isinstance(self.scheduler, DraftLengthScheduler) and self.scheduler.lenience() is not None \
                and not self.sampling.greedy:
            raise ValueError(f"{type(self.scheduler).__name__}'s lenient (rollback) verification is "
                             f"greedy only, as BiLD's reference; use temperature 0, or no rollback "
                             f"threshold for exact speculative sampling")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not 1 <= self.max_draft <= 256:
            raise ValueError(f"max_draft must be in [1, 256], got {self.max_draft}")


@dataclass
class SpecResult:
    """What `speculative_generate` returns.

    Attributes:
        tokens: (N,) long generated tokens (through the first end-of-text when stopping at it).
        text: decoded `tokens` without special tokens (None without a tokenizer).
        appended: tokens appended per target forward (Spec-Bench's accept length: accepted
            drafts plus the correction/bonus token; 1 for plain AR).
        drafted: draft length (levels: a tree's depth) verified by each target forward.
        matched: drafts accepted by each target forward (the accepted path's length).
        nodes: draft tokens verified by each target forward (a tree's node count; a chain's
            length).
        target_forwards: target forward passes (one per round; the first also prefills).
        draft_forwards: drafter forward passes (dLLM NFE for a diffusion drafter).
        seconds: wall-clock of the call.
    """

    tokens: Tensor
    appended: list[int]
    drafted: list[int]
    matched: list[int]
    target_forwards: int
    draft_forwards: int
    seconds: float
    text: str | None = None
    nodes: list[int] = field(default_factory=list)

    @property
    def mean_accepted(self) -> float:
        """Mean tokens appended per target forward (Spec-Bench `#Mean accepted tokens`)."""
        return sum(self.appended) / max(1, len(self.appended))

    @property
    def acceptance_rate(self) -> float:
        """Per-token acceptance estimate alpha: accepted drafts / accept-or-reject decisions made
        (a round stops at its first rejection, so later drafts are never judged)."""
        decisions = sum(m + (m < d) for m, d in zip(self.matched, self.drafted))
        return sum(self.matched) / decisions if decisions else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "tokens": self.tokens.tolist(), "new_tokens": len(self.tokens),
                "target_forwards": self.target_forwards, "draft_forwards": self.draft_forwards,
                "accepted_per_target_call": self.appended, "draft_lengths": self.drafted,
                "draft_nodes": self.nodes,
                "mean_accepted_tokens": self.mean_accepted,
                "target_forwards_per_token": self.target_forwards / max(1, len(self.tokens)),
                "acceptance_rate": self.acceptance_rate, "seconds": self.seconds}


@torch.inference_mode()
def speculative_generate(target: Any, prompt: str | Sequence[int] | Tensor, config: SpecConfig,
                         drafter: Drafter | None = None, *, generator: torch.Generator | None = None,
                         tokenizer: Any = None, eos_ids: Sequence[int] | None = None) -> SpecResult:
    """Decode one prompt with the target, drafting with `drafter` and verifying every round.

    Greedy sampling returns exactly the target's own greedy tokens (in exact arithmetic; fp32 on
    CPU in the tests); sampling returns tokens distributed exactly as the target's (Leviathan
    et al. 2023). `drafter=None` is plain autoregressive decoding with a KV cache.

    Args:
        target: a transformers causal LM (`input_ids`, `past_key_values`, `logits_to_keep`).
        prompt: text (needs a tokenizer; special tokens are not added, apply a chat template
            first) or token ids.
        config: scheduler, budget, sampling.
        drafter: proposes tokens (`ModelDrafter`, `LookupDrafter`, `DiffusionDrafter`, ...).
        generator: the only source of randomness.
        tokenizer: default `target.tokenizer`; encodes a text prompt and decodes the output.
        eos_ids: end-of-text ids (default: from the tokenizer and the target's configs).
    Raises:
        ValueError: empty prompt, text without a tokenizer, or prompt plus `max_new_tokens`
            longer than the target's context (positions past it would be garbage, not an error).
    """
    started = time.perf_counter()
    if not isinstance(config, SpecConfig):
        raise TypeError(f"config must be a SpecConfig, got {type(config).__name__} "
                        f"(build one: SpecConfig(scheduler=..., max_new_tokens=...))")
    if drafter is not None and not isinstance(drafter, Drafter):
        raise TypeError(f"drafter must be a Drafter or None, got {type(drafter).__name__}")
    _check_causal(target)
    tokenizer = tokenizer if tokenizer is not None else getattr(target, "tokenizer", None)
    kv = new_kv(target)
    device = kv.ids.device
    vocab = _vocab_size(target)
    (ids,) = encode_prompts([prompt] if not isinstance(prompt, Tensor) else [prompt.tolist()], tokenizer,
                            vocab)
    limit = context_of(target)
    if limit is not None and len(ids) + config.max_new_tokens > limit:
        raise ValueError(f"prompt ({len(ids)} tokens) + max_new_tokens ({config.max_new_tokens}) "
                         f"exceeds the model's context of {limit} tokens")
    context = torch.tensor(ids, dtype=torch.long, device=device)
    eos = _check_eos(eos_ids, vocab) if eos_ids is not None else eos_ids_of(target, tokenizer)
    eos_tensor = torch.tensor(eos, dtype=torch.long, device=device)
    scheduler, sampling = config.scheduler, config.sampling
    adaptive = isinstance(scheduler, DraftLengthScheduler)
    sched_state = scheduler.init_state(1, device)
    draft_state = drafter.init_state() if drafter is not None else None
    lenience = scheduler.lenience() if adaptive else None
    appended: list[int] = []
    drafted: list[int] = []
    matched: list[int] = []
    nodes: list[int] = []
    draft_forwards = 0
    prompt_length = context.shape[0]
    while (remaining := config.max_new_tokens - (context.shape[0] - prompt_length)) > 0:
        width = min(config.max_draft, remaining - 1)     # the target adds one more token
        if adaptive:
            width = min(width, scheduler.propose_length(sched_state) or width)
        draft = Draft.empty(device)
        if drafter is not None and width > 0:
            stop = None
            if config.early_stop and (not adaptive or scheduler.early_stops):
                stop = EarlyStop(scheduler, width, vocab, eos)
            draft, draft_state = drafter.propose(context, width, sampling, generator, eos,
                                                 draft_state, stop)
            draft_forwards += draft.forwards
            if len(draft) and (not adaptive or scheduler.cuts):
                state = sched_state if adaptive else scheduler.init_state(1, device)
                spine = draft.spine()
                g, state = draft_length(scheduler, spine, state, vocab, width, generator, eos)
                if not sampling.greedy:
                    # Whether a sampled draft token is verified must not depend on the token
                    # itself (a cut before a low-confidence token biases the law); verify the
                    # token that stopped the run too, as HF's confidence stop does.
                    g = min(len(spine), g + 1)
                sched_state = state if adaptive else sched_state
                draft = draft.head(g)
        g = draft.depth
        new, path, kv, _ = verify_round(target, kv, context, draft, sampling, generator, lenience)
        n = len(path)
        if adaptive and g:
            sched_state = scheduler.feedback(sched_state, g, n)
        new = new[:remaining]
        finished = False
        if config.stop_at_eos and eos:
            is_eos = torch.isin(new, eos_tensor)
            first = int(torch.where(is_eos.any(), is_eos.int().argmax(), new.shape[0]))
            finished = first < new.shape[0]
            new = new[:first + 1]
        context = torch.cat([context, new])
        appended.append(int(new.shape[0]))
        drafted.append(g)
        matched.append(n)
        nodes.append(len(draft))
        if finished:
            break
    tokens = context[prompt_length:].cpu()
    text = tokenizer.decode(tokens.tolist(), skip_special_tokens=True) if tokenizer is not None else None
    return SpecResult(tokens=tokens, appended=appended, drafted=drafted, matched=matched,
                      target_forwards=len(appended), draft_forwards=draft_forwards,
                      seconds=time.perf_counter() - started, text=text, nodes=nodes)


class Verdict(NamedTuple):
    """One verification round's outcome.

    Attributes:
        tokens: (n + 1,) long tokens to append: the accepted path and one target token.
        path: the accepted node indices (a chain's: 0..n-1).
        kv: the target's state; its cache holds exactly the context plus the accepted path (the
            appended target token is fed with the next drafts; HF crops to `new_cur_len - 1`).
        logits: (n + 1, V) float32 the target's logits at each appended token's position (what
            a staged drafter reports as its draft law).
    """

    tokens: Tensor
    path: list[int]
    kv: KV
    logits: Tensor


def verify_round(target: Any, kv: KV, context: Tensor, draft: Draft, sampling: Sampling,
                 generator: torch.Generator | None, lenience: float | None = None) -> Verdict:
    """One target forward over the context's uncached tail plus the draft (a chain, or a token
    tree under its tree mask), verification, and the cache cut back to the accepted path.

    Args:
        lenience: BiLD's rollback threshold in nats for a lenient greedy check (None: exact).
    """
    g = len(draft)
    logits, kv = extend(target, kv, torch.cat([context, draft.tokens]), g + 1, draft.parents)
    if sampling.greedy:
        path, new = greedy_tree(draft.tokens, draft.parents, logits, lenience)
    else:
        path, new = sample_tree(draft.tokens, draft.parents, draft.probs, sampling.probs(logits),
                                generator)
    rows = torch.tensor([0] + [node + 1 for node in path], device=logits.device)
    return Verdict(new, path, keep_path(kv, context.shape[0], path), logits[rows])


def _check_causal(target: Any) -> None:
    """A transformers-style causal LM (a forward taking `input_ids`, `past_key_values`); a
    masked diffusion LM here is a usage error, not an AttributeError deep in the loop."""
    if hasattr(target, "mask_token_id") and hasattr(target, "eos_token_ids"):
        raise TypeError(f"target {type(target).__name__} is a masked diffusion LM; "
                        f"speculative_generate needs a causal LM (decode it with generate)")
    if not callable(target):
        raise TypeError(f"target must be a causal LM (a transformers *ForCausalLM or the compact "
                        f"runtime), got {type(target).__name__}")


def _check_eos(eos_ids: Any, vocab: int) -> tuple[int, ...]:
    if isinstance(eos_ids, (str, bytes)) or not isinstance(eos_ids, Sequence):
        raise TypeError(f"eos_ids must be a sequence of token ids, got {type(eos_ids).__name__}")
    for item in eos_ids:
        if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item < vocab:
            raise ValueError(f"eos_ids holds {item!r}; end-of-text ids must be integers in [0, {vocab})")
    return tuple(eos_ids)


def eos_ids_of(model: Any, tokenizer: Any = None) -> tuple[int, ...]:
    """End-of-text ids from the tokenizer, the generation config and the model config."""
    if model is None:
        raise TypeError("eos_ids_of needs a model, got None")
    found: list[int] = []
    sources = (getattr(tokenizer, "eos_token_id", None),
               getattr(getattr(model, "generation_config", None), "eos_token_id", None),
               getattr(getattr(model, "config", None), "eos_token_id", None))
    for value in sources:
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, int) and item >= 0 and item not in found:
                found.append(item)
    return tuple(found)


def context_of(model: Any) -> int | None:
    """The positions a causal LM can attend over (`config.max_position_embeddings`), or None
    when its config does not say."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return int(limit) if isinstance(limit, int) else None


def _vocab_size(model: Any) -> int:
    config = getattr(model, "config", None)
    size = getattr(config, "vocab_size", None) or getattr(model, "vocab_size", None)
    if size is None:
        raise ValueError(f"cannot tell the vocabulary size of {type(model).__name__}")
    return int(size)
