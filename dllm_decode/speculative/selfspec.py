"""dLLM self-speculation: the diffusion model drafts several of its own denoising steps from one
forward and verifies them all in the next (batched) forward.

FreeDave (Wu & Zhang, arXiv 2510.00294), the chain check that SSD (arXiv 2510.04147) and Spiffy
(arXiv 2509.18085) also perform (a draft is accepted only when the model's own next step from the previous draft equals it): from the logits of the
current state x, apply the deterministic unmasking rule j times to *stale* logits to get nested
drafts d_1 ⊂ d_2 ⊂ ... ⊂ d_K (d_1 is the true next state: its logits are fresh); one batched
forward on all drafts gives each draft's fresh logits and so its true successor t_j; accept the
longest chain with d_{j+1} == t_j, and the accepted draft's logits are the next state's. Every
forward both verifies and proposes, so the output equals the model's own stepwise decoding
under the same rule (one token per step with `low_confidence`), with at most as many forwards.
The forwards are K rows wide: fewer forwards buy wall-clock only where a batched forward costs
less than K single ones.

Built on the model's public forward (`DiffusionLM`) and the step maths of `dllm_decode.step` (the
view every scheduler sees in `generate`: no cache, temperature 0, no filters), which the tests
check against `generate` token for token. A block-diffusion model (`block_size`) is decoded as
the loop decodes it: the canvas runs to its block grid, blocks lie on the grid, and a token-shifted
model commits a block's first position alone in the block's first step (`models.block_grid`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode.config import DecodeConfig, DecodeResult
from dllm_decode.devices import device_of
from dllm_decode.interfaces import DiffusionLM, NoCache, Scheduler
from dllm_decode.member import check_request
from dllm_decode.models.block_grid import block_start_columns, grid_canvas
from dllm_decode.prompts import left_pad
from dllm_decode.step import propose, resolve, step_input, write

RANDOM_RULES = ("random",)
"""Registered unmasking rules that draw random numbers (their drafts cannot be replayed)."""


@dataclass
class SelfSpecResult:
    """What `self_speculative_generate` returns.

    Attributes:
        result: the decode (`DecodeResult`, batch 1; `nfe` counts forward passes).
        steps: denoising steps taken: the forwards the stepwise decoder needs (its NFE).
        forwards: forward passes (each verification forward counted once).
        rows: canvas rows computed (a verification forward over k drafts counts k).
        advanced: steps each verification forward advanced (accepted chain length).
    """

    result: DecodeResult
    steps: int
    forwards: int
    rows: int
    advanced: list[int]

    def to_dict(self) -> dict[str, Any]:
        return {"tokens": self.result.tokens[0].tolist(), "text": (self.result.text or [None])[0],
                "steps": self.steps, "forwards": self.forwards, "rows": self.rows,
                "forward_reduction": self.steps / max(1, self.forwards),
                "advanced_per_forward": self.advanced, "seconds": self.result.seconds}


def check_self_speculation(config: DecodeConfig) -> None:
    """Raise a one-line ValueError for a decode config self-speculation cannot replay exactly."""
    from dllm_decode.registry import name_of

    scheduler = config.scheduler
    problem = None
    if config.temperature != 0:
        problem = f"temperature {config.temperature} (drafts must be replayable: use 0)"
    elif not isinstance(config.cache, NoCache):
        problem = f"cache {type(config.cache).__name__} (only the `none` cache is replayed exactly)"
    elif config.filters:
        problem = "filters (none are supported)"
    elif name_of(scheduler) in RANDOM_RULES:
        problem = f"the random rule {name_of(scheduler)!r}"
    elif scheduler.init_state(1, torch.device("cpu")) is not None:
        problem = f"the stateful rule {name_of(scheduler)!r} (its state would be forked per draft)"
    elif scheduler.chooses_block_bounds or scheduler.view != "block" or \
            type(scheduler).process_logits is not Scheduler.process_logits:
        problem = f"the rule {name_of(scheduler)!r} (block bounds, wide view or logit processing)"
    if problem is not None:
        raise ValueError(f"self-speculation replays a deterministic, stateless unmasking rule "
                         f"without cache or filters (e.g. low_confidence, threshold); got {problem}")


@torch.inference_mode()
def self_speculative_generate(model: DiffusionLM, prompt: str | Sequence[int], config: DecodeConfig,
                              *, draft_steps: int = 8, branch: int = 1,
                              tokenizer: Any = None) -> SelfSpecResult:
    """Decode one prompt with `config`'s rule, drafting up to `draft_steps` steps per forward.

    Args:
        model: a DiffusionLM.
        prompt: text (needs a tokenizer) or token ids.
        config: the stepwise decode to reproduce (scheduler, gen/block length, stop_at_eos).
        draft_steps: K, nested drafts verified per forward (1: the stepwise decoder itself).
        branch: drafts per step: the nested draft plus `branch - 1` leaves holding the rule's
            next choices (the stale ordering is what fails most: with one token per step on
            the embedded model, 220 of 227 rejections picked another position).
        tokenizer: default `model.tokenizer`.
    Raises:
        ValueError: a config `check_self_speculation` refuses, K outside [1, 64], or what every
            decode entry point refuses (`member.check_request`: an empty prompt, a prompt that
            with its generation and a block model's grid tail does not fit the model's context,
            a block length a block-diffusion model cannot decode).
    """
    check_self_speculation(config)
    if not 1 <= draft_steps <= 64:
        raise ValueError(f"draft_steps must be in [1, 64], got {draft_steps}")
    if not 1 <= branch <= 8:
        raise ValueError(f"branch must be in [1, 8], got {branch}")
    started = time.perf_counter()
    ((ids,), tokenizer) = check_request(model, config.cache, [prompt] if isinstance(prompt, str)
                                        else [list(prompt)], config, None, tokenizer)
    device = device_of(model)
    eos = tuple(model.eos_token_ids)
    x, _ = left_pad([ids], config.gen_length, model.mask_token_id, eos[0], device)
    x, _ = grid_canvas(model, x, None, [len(ids)], config.gen_length, model.mask_token_id, eos[0])
    width = x.shape[1]                  # a block-diffusion model's canvas runs to its grid
    gen_start = len(ids)
    grid = getattr(model, "block_size", None)
    rule = _Rule(config.scheduler, model.mask_token_id, eos, gen_start, width, model)
    logits, origin = model(x, None, rows=(gen_start, width)), gen_start   # logits of x from `origin`
    forwards = rows = 1
    steps = 0
    advanced: list[int] = []
    start = gen_start
    while start < width:
        into = start % config.block_length if grid else 0     # blocks on the model's grid
        end = min(start + config.block_length - into, width)
        step = 0
        fresh = logits[:, start - origin:end - origin]
        while bool((x[:, start:end] == model.mask_token_id).any()):
            spine, leaves, final = rule.drafts(x, fresh, step, (start, end), draft_steps, branch,
                                               config.stop_at_eos)
            with_rows = len(spine) - final            # a final draft needs no logits of its own
            batch = spine[:with_rows] + [leaf for _, leaf in leaves]
            if batch:
                out = model(torch.cat(batch), None, rows=(start, width))    # the verify forward
                forwards += 1
                rows += len(batch)
            # Walk: the accepted state's true successor (from its fresh logits) must be drafted.
            best, state, row = 1, spine[0], (0 if with_rows else None)
            while row is not None:
                successor = rule.apply(state, out[row:row + 1, :end - start], step + best, (start, end))
                if best < len(spine) and torch.equal(successor, spine[best]):
                    state, row = spine[best], (best if best < with_rows else None)
                    best += 1
                    continue
                hit = next((k for k, (depth, leaf) in enumerate(leaves)
                            if depth == best and torch.equal(successor, leaf)), None)
                if hit is not None:                   # a leaf: accepted, nothing drafted below it
                    state, row = leaves[hit][1], with_rows + hit
                    best += 1
                break
            x = state
            step += best
            steps += best
            advanced.append(best)
            if row is None:                           # the final draft was accepted: done
                break
            logits, origin = out[row:row + 1], start
            fresh = logits[:, :end - start]
        if config.stop_at_eos and rule.has_eos(x, start, end):
            x = x.clone()
            x[:, end:] = eos[0]                           # the loop's stop: the rest is end-of-text
            break
        start = end
    tokens = x[:, gen_start:gen_start + config.gen_length].cpu()
    is_eos = torch.isin(tokens, torch.tensor(eos))
    answer = torch.where(is_eos.any(-1), is_eos.int().argmax(-1), tokens.shape[1])
    text = None
    if tokenizer is not None:
        text = [tokenizer.decode(tokens[0, :int(answer[0])].tolist(), skip_special_tokens=True).strip()]
    result = DecodeResult(tokens=tokens, nfe=torch.tensor([forwards]), answer_lengths=answer,
                          seconds=time.perf_counter() - started, text=text)
    return SelfSpecResult(result, steps, forwards, rows, advanced)


class _Rule:
    """One denoising step of a stateless rule on a batch-1 canvas, built as `Decoding` builds it
    (window = the active block, [MASK] never a candidate, argmax candidates, the loop's
    `Decision.resolve`, and a token-shifted block model's block start committed alone in its
    block's first step, `models.block_grid.block_start_columns`)."""

    def __init__(self, scheduler: Scheduler, mask_id: int, eos: tuple[int, ...], gen_start: int,
                 width: int, model: Any = None):
        self.scheduler, self.mask_id, self.eos, self.model = scheduler, mask_id, eos, model
        self.gen_span = torch.tensor([[gen_start, width]])

    def has_eos(self, x: Tensor, start: int, end: int) -> bool:
        """Whether the block holds an end-of-text token (the loop stops after such a block)."""
        return bool(torch.isin(x[:, start:end], torch.tensor(self.eos, device=x.device)).any())

    def drafts(self, x: Tensor, logits: Tensor, step: int, block: tuple[int, int], depth: int,
               branch: int, stop_at_eos: bool) -> tuple[list[Tensor], list[tuple[int, Tensor]], bool]:
        """Nested drafts from the logits of `x` (fresh for the first step, stale after) and
        leaves: `(j, canvas)`, the rule's next choices besides draft j (drafted from draft j - 1
        with draft j's commits excluded; SSD's tree of drafts, cut to one level).

        Returns:
            The spine (draft j = j + 1 steps after x), the leaves, and whether the last draft
            ends the decode (its block is full and it is the last block, or holds end-of-text).
        """
        start, end = block
        spine: list[Tensor] = []
        leaves: list[tuple[int, Tensor]] = []
        y = x
        for j in range(depth):
            nxt = self.apply(y, logits, step + j, block)
            if j and branch > 1:                  # draft 0 comes from fresh logits: it is exact
                taken = nxt[:, start:end] != y[:, start:end]
                for _ in range(branch - 1):
                    alt = self.apply(y, logits, step + j, block, exclude=taken)
                    if alt is None:
                        break
                    leaves.append((j, alt))
                    taken = taken | (alt[:, start:end] != y[:, start:end])
            spine.append(nxt)
            y = nxt
            if not bool((y[:, start:end] == self.mask_id).any()):
                final = end == int(self.gen_span[0, 1]) or (stop_at_eos and self.has_eos(y, start, end))
                return spine, leaves, bool(final)
        return spine, leaves, False

    def apply(self, x: Tensor, logits: Tensor, step: int, block: tuple[int, int],
              exclude: Tensor | None = None) -> Tensor | None:
        """The canvas after one step at block step `step` of `block`, from the (1, W, V) logits of
        the block's columns; `exclude` (1, W) makes columns ineligible (None if none is left)."""
        start, end = block
        window = x[:, start:end]
        eligible = window == self.mask_id
        if exclude is not None and not bool((eligible & ~exclude).any()):
            return None
        if step == 0:
            allowed = block_start_columns(self.model, eligible, torch.arange(start, end, device=x.device),
                                          torch.tensor([[start]], device=x.device), [start])
            if allowed is not None:
                exclude = ~allowed if exclude is None else exclude | ~allowed
        logits, probs, candidates = propose(logits, self.mask_id)
        inp = step_input(logits=logits, probs=probs, candidates=candidates, current=window,
                         block=torch.tensor([[start, end]], device=x.device), offset=start,
                         gen_span=self.gen_span.to(x.device), exclude=exclude, step=step,
                         eos_ids=self.eos, mask_id=self.mask_id)
        decision, _ = self.scheduler.select(inp, None)
        out = x.clone()
        out[:, start:end] = write(window, resolve(inp, decision), self.mask_id)
        return out

