"""The batched canvas the self-speculative decoders of block-diffusion models share.

S2D2, PSD and SimSD (`dllm_decode.speculative.s2d2`, `psd`, `simsd`) each drive their own rounds
(draft, verify, accept), but hold the same per-row record: a left-padded canvas run to the model's
block grid (`models.block_grid.grid_canvas`), each row's active decode block and step within it,
and the honest counters (forwards and canvas rows per sample, verification forwards included).
This module holds that record, the base rule's step (the view every scheduler sees in `generate`,
built by `dllm_decode.step`, with the loop's block-start rule for token-shifted models), and the
autoregressive ("block size 1") forward a block model verifies its own drafts with.

Forwards are full-canvas forwards without a cache: on a block-causal model the exact `block` cache
gives the same logits and the same forward count (one per step), so NFE compares with `generate`
under `block`; the compute per forward is larger here (every row is recomputed). Rows advance on
their own: every loop iteration runs one batched forward over the rows still decoding.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from dllm_decode.config import DecodeConfig, DecodeResult
from dllm_decode.devices import device_of
from dllm_decode.interfaces import DiffusionLM, NoCache, Scheduler
from dllm_decode.member import check_request
from dllm_decode.models.block_grid import block_start_columns, grid_canvas, grid_tails
from dllm_decode.models.layers import block_causal_mask, default_positions
from dllm_decode.prompts import left_pad
from dllm_decode.step import StepInput, propose, resolve, step_input, write
from dllm_decode.errors import model_name


def check_base(config: DecodeConfig, what: str) -> None:
    """Raise a one-line ValueError for a decode config a self-speculative decoder cannot replay:
    the base rule must be deterministic and stateless, at temperature 0, without cache or filters."""
    from dllm_decode.registry import name_of

    scheduler = config.scheduler
    problem = None
    if config.temperature != 0:
        problem = f"temperature {config.temperature} (use 0)"
    elif not isinstance(config.cache, NoCache):
        problem = f"cache {type(config.cache).__name__} (use `none`: forwards recompute the canvas)"
    elif config.filters:
        problem = "filters (none are supported)"
    elif name_of(scheduler) == "random" or scheduler.init_state(1, torch.device("cpu")) is not None:
        problem = f"the rule {name_of(scheduler)!r} (random or stateful)"
    elif scheduler.chooses_block_bounds or scheduler.view != "block" or scheduler.revises != "none" \
            or type(scheduler).process_logits is not Scheduler.process_logits \
            or scheduler.lookahead_candidates or scheduler.guide is not None:
        problem = f"the rule {name_of(scheduler)!r} (block bounds, wide view, revisions, logit " \
                  f"processing or extra forwards)"
    if problem is not None:
        raise ValueError(f"{what} replays a deterministic, stateless commit-only rule without cache "
                         f"or filters (e.g. threshold, low_confidence); got {problem}")


def check_mask_canvas(model: DiffusionLM, what: str) -> None:
    """Raise a one-line ValueError for a model whose uncommitted positions hold noise, not a
    [MASK] (DiffusionGemma): drafts and verification read masked columns."""
    kind = getattr(model, "canvas_kind", "mask")
    if kind != "mask":
        name = model_name(model)
        raise ValueError(f"{what} drafts into [MASK] positions; {name} decodes a {kind} canvas "
                         f"(use the denoising loop)")


def check_verifier(model: DiffusionLM, what: str) -> None:
    """Raise a one-line ValueError unless `model` is a block-diffusion model with
    `verify_forward` (a `DecoderLM` family: Fast-dLLM v2 with the token shift, or SDAR)."""
    if not getattr(model, "block_size", None) or getattr(model, "token_shift", None) not in (0, 1) \
            or not hasattr(model, "verify_forward"):
        name = model_name(model)
        raise ValueError(f"{what} verifies in the block model's autoregressive mode and needs a "
                         f"block-diffusion model with verify_forward (Fast-dLLM v2 family, e.g. "
                         f"embedded-bd, or SDAR); {name} is not one")


@dataclass
class Counters:
    """Per sample: forwards (NFE, verification forwards included), canvas rows computed (a
    forward over k canvases of one sample counts k), the forwards that verified, and the token
    columns fed (a verification with query copies feeds more columns than the canvas)."""

    forwards: Tensor
    rows: Tensor
    verifies: Tensor
    fed: Tensor

    @staticmethod
    def zeros(batch: int) -> Counters:
        return Counters(*(torch.zeros(batch, dtype=torch.long) for _ in range(4)))

    def count(self, rows: Tensor, fed: int, verify: bool = False) -> None:
        """One forward in which each of the (device) batch rows `rows` (a sample may repeat: one
        canvas each) fed `fed` token columns."""
        index = rows.cpu()
        self.forwards[index.unique()] += 1
        self.rows.index_add_(0, index, torch.ones_like(index))
        self.fed.index_add_(0, index, torch.full_like(index, fed))
        if verify:
            self.verifies[index.unique()] += 1


@dataclass
class BlockRun:
    """A batch being decoded by a self-speculative decoder: canvas, blocks, progress, counters.

    Attributes:
        x: (B, W) canvas: left padding, prompt, generation, and the grid tail.
        attention: (B, W) 0/1, or None when no row is padded or cut.
        positions: (B, W) each column's position (real tokens before it).
        gen_start: the first generated column (every row's, prompts are right-aligned).
        gen_end: (B,) the column after each row's last decodable one (its grid tail included).
        start, end: (B,) each row's active decode block `[start, end)` in columns.
        step: (B,) steps taken in the active block.
        done: (B,) rows that finished (every block decoded, or an end-of-text block).
    """

    model: Any
    config: DecodeConfig
    x: Tensor
    attention: Tensor | None
    positions: Tensor
    gen_start: int
    gen_end: Tensor
    start: Tensor
    end: Tensor
    step: Tensor
    done: Tensor
    counters: Counters
    tokenizer: Any = None
    started: float = field(default_factory=time.perf_counter)

    @staticmethod
    def checked(what: str, model: DiffusionLM, prompts: Sequence[str | Sequence[int]],
                config: DecodeConfig, tokenizer: Any, generator: torch.Generator | None,
                verifier: bool) -> tuple[BlockRun, torch.Generator]:
        """The batch of decoder `what` after its checks (`check_verifier` when it verifies in
        AR mode, `check_base`), and the request's generator (seeded by `config.seed` if None)."""
        check_mask_canvas(model, what)
        if verifier:
            check_verifier(model, what)
        check_base(config, what)
        run = BlockRun.open(model, prompts, config, tokenizer)
        return run, generator or torch.Generator(device=run.x.device).manual_seed(config.seed)

    @staticmethod
    def open(model: DiffusionLM, prompts: Sequence[str | Sequence[int]], config: DecodeConfig,
             tokenizer: Any = None) -> BlockRun:
        """The batch after the checks every decode entry point makes (`member.check_request`)."""
        ids, tokenizer = check_request(model, config.cache, list(prompts), config, None, tokenizer)
        device = device_of(model)
        mask, eos = model.mask_token_id, tuple(model.eos_token_ids)
        x, attention = left_pad(ids, config.gen_length, mask, eos[0], device)
        x, attention = grid_canvas(model, x, attention, [len(r) for r in ids], config.gen_length, mask, eos[0])
        width = x.shape[1]
        gen_start = max(len(r) for r in ids)                 # prompts are right-aligned there
        tails = torch.tensor(grid_tails(model, [len(r) for r in ids], config.gen_length), device=device)
        gen_end = gen_start + config.gen_length + tails
        positions = default_positions(attention, x.shape[0], width, device)
        batch = x.shape[0]
        start = torch.full((batch,), gen_start, dtype=torch.long, device=device)
        run = BlockRun(model, config, x, attention, positions, gen_start, gen_end, start, start.clone(),
                       torch.zeros(batch, dtype=torch.long, device=device),
                       torch.zeros(batch, dtype=torch.bool, device=device), Counters.zeros(batch),
                       tokenizer)
        run.end = run.block_end(start)
        return run

    # ---- blocks -------------------------------------------------------------------------
    def block_end(self, start: Tensor) -> Tensor:
        """(B,) end of the decode block starting at `start`: blocks lie on the grid of
        `block_length` in positions for a block model (as in `generate`), else run from `start`."""
        length = self.config.block_length
        into = (self.positions.gather(1, start.clamp_max(self.x.shape[1] - 1).unsqueeze(1)).squeeze(1)
                % length) if getattr(self.model, "block_size", None) else torch.zeros_like(start)
        return torch.minimum(start + length - into, self.gen_end)

    def columns(self) -> Tensor:
        return torch.arange(self.x.shape[1], device=self.x.device)

    def in_block(self, rows: Tensor) -> Tensor:
        """(b, W) whether each column lies in the row's active block."""
        cols = self.columns()
        return (cols >= self.start[rows, None]) & (cols < self.end[rows, None])

    def masked_in_block(self, rows: Tensor) -> Tensor:
        return self.in_block(rows) & (self.x[rows] == self.model.mask_token_id)

    def advance(self) -> None:
        """Rows whose block holds no mask move to their next block, or finish (the loop's stop
        after an end-of-text block, or the last block)."""
        mask, eos = self.model.mask_token_id, tuple(self.model.eos_token_ids)
        in_block = self.in_block(torch.arange(len(self.x), device=self.x.device))
        full = ~self.done & ~(in_block & (self.x == mask)).any(-1)
        if not bool(full.any()):
            return
        has_eos = (in_block & torch.isin(self.x, torch.tensor(eos, device=self.x.device))).any(-1)
        stop = full & (self.end >= self.gen_end)
        if self.config.stop_at_eos:
            ended = full & has_eos & ~stop
            after = self.columns()[None, :] >= self.end[:, None]
            fill = ended[:, None] & after & (self.columns()[None, :] < self.gen_end[:, None])
            self.x = self.x.masked_fill(fill, eos[0])
            stop = stop | ended
        self.done = self.done | stop
        move = full & ~stop
        self.start = torch.where(move, self.end, self.start)
        self.end = torch.where(move, self.block_end(self.start), self.end)
        self.step = torch.where(move, torch.zeros_like(self.step), self.step)

    def live(self) -> Tensor:
        """(b,) the rows still decoding."""
        return (~self.done).nonzero().squeeze(1)

    # ---- forwards -----------------------------------------------------------------------
    def logits(self, rows: Tensor, canvas: Tensor | None = None, verify: bool = False) -> Tensor:
        """(b, W - gen_start, V) block-diffusion logits of the generation columns: one forward,
        counted (`rows` may repeat a sample: one canvas each; `verify`: it verifies drafts)."""
        x = self.x[rows] if canvas is None else canvas
        attention = None if self.attention is None else self.attention[rows]
        self.counters.count(rows, x.shape[1], verify)
        return self.model(x, attention, rows=(self.gen_start, self.x.shape[1]))

    def ar_logits(self, rows: Tensor, canvas: Tensor, order: Tensor | None = None) -> Tensor:
        """(b, W - gen_start, V) verifier logits of the generation columns (one verification
        forward, counted): the row's active model block run in autoregressive mode (block size 1). Columns of finished blocks keep the
        model's own pattern, so their K/V are the cached prefix's (not S2D2's `cache_ver`).

        Without `order`, a token-shifted model (Fast-dLLM v2): one forward of the canvas, the
        active block causal; column i's logits are the network's row i - 1 (no copies needed).
        With `order` (b, W), SimSD's step-causal layout: inside the active block a canvas row j
        attends columns k <= j with order[k] <= order[j], and a query copy per column i, fed after
        the canvas at the position of the column r whose row predicts i (i - 1 when shifted, else
        i itself) with the token r held before i was drafted (shifted and order[r] < order[i]:
        its token; else [MASK]), attends the earlier blocks, the columns k < r with
        order[k] < order[i], and itself; its output is column i's logits. An unshifted model
        (SDAR) always takes this layout (without `order`: order by column, S2D2's 2L layout).
        With order increasing along the columns every form is the same autoregressive decode."""
        positions = self.positions[rows]
        attention = None if self.attention is None else self.attention[rows]
        width, g = canvas.shape[1], self.gen_start
        native = block_causal_mask(positions, (0, width), self.model.block_size, attention)[:, 0]
        grid = torch.div(positions, self.model.block_size, rounding_mode="floor")
        inside = grid == grid.gather(1, self.start[rows, None])                 # (b, W) active block
        pair = inside[:, :, None] & inside[:, None, :]
        cols = self.columns()
        causal = cols[None, :] <= cols[:, None]                                # (W, W) [q, k]
        shift = self.model.token_shift
        if order is None and shift:
            mask = native & (~pair | causal)
            self.counters.count(rows, width, verify=True)
            return self.model.verify_forward(canvas, mask[:, None], positions, (g - 1, width - 1))
        if order is None:                       # unshifted: [MASK] copies, position-causal
            order = cols.expand(len(rows), -1)
        data = native & (~pair | (causal & (order[:, None, :] <= order[:, :, None])))
        query_cols = cols[g:]                                                  # one copy per column
        before = query_cols - shift                  # the column whose row predicts it
        known = order.gather(1, before.expand(len(rows), -1)) < order[:, g:]
        tokens = torch.where(known & bool(shift), canvas[:, before], self.model.mask_token_id)
        q_pos = positions[:, before]
        # a copy of a column in the active block: the earlier blocks, and the columns before it
        # unmasked before the column it verifies; of a column before the block: its own pattern
        seen = inside[:, None, :] & (cols[None, None, :] < before[None, :, None]) \
            & (order[:, None, :] < order[:, g:, None])
        in_block = (~inside[:, None, :] | seen) & native[:, before]
        to_canvas = torch.where(inside[:, before, None], in_block, native[:, before]) \
            & (cols[None, :] != before[:, None])                 # the copy stands for its column
        n = len(query_cols)
        itself = torch.eye(n, dtype=torch.bool, device=canvas.device).expand(len(rows), n, n)
        top = torch.cat([data, torch.zeros(len(rows), width, n, dtype=torch.bool, device=canvas.device)], -1)
        mask = torch.cat([top, torch.cat([to_canvas, itself], -1)], 1)
        fed = torch.cat([canvas, tokens], 1)
        self.counters.count(rows, fed.shape[1], verify=True)
        return self.model.verify_forward(fed, mask[:, None], torch.cat([positions, q_pos], 1),
                                         (width, width + n))

    # ---- the base rule's step -----------------------------------------------------------
    def view(self, rows: Tensor, logits: Tensor, canvas: Tensor | None = None,
             exclude: Tensor | None = None, steps: Tensor | None = None) -> list[tuple[Tensor, StepInput]]:
        """The scheduler's views of `rows` (grouped by their block step, which every row of a
        view shares), over the generation columns, on `canvas` (default the batch's) and the
        (b, W - gen_start, V) logits, at block steps `steps` (b,) (default the rows' own; the
        block-start rule of a token-shifted model applies at step 0)."""
        x = self.x[rows] if canvas is None else canvas
        g = self.gen_start
        current = x[:, g:]
        steps = self.step[rows] if steps is None else steps
        first = steps == 0
        mask = self.model.mask_token_id
        views = []
        for value in torch.unique(steps).tolist():
            pick = (steps == value).nonzero().squeeze(1)
            sub = rows[pick]
            cols = torch.arange(g, x.shape[1], device=x.device)
            drop = None if exclude is None else exclude[pick]
            eligible = (current[pick] == mask) & (cols >= self.start[sub, None]) & (cols < self.end[sub, None])
            allowed = block_start_columns(self.model, eligible, cols, self.start[sub, None],
                                          self.positions[sub].gather(1, self.start[sub, None]).squeeze(1).tolist())
            if allowed is not None:
                restrict = ~allowed & first[pick, None]
                drop = restrict if drop is None else drop | restrict
            lg, probs, candidates = propose(logits[pick], mask)
            block = torch.stack([self.start[sub], self.end[sub]], -1)
            gen_span = torch.stack([torch.full_like(self.gen_end[sub], g), self.gen_end[sub]], -1)
            inp = step_input(logits=lg, probs=probs, candidates=candidates, current=current[pick],
                             block=block, gen_span=gen_span, offset=g, exclude=drop, step=int(value),
                             num_steps=self.config.block_length, eos_ids=tuple(self.model.eos_token_ids),
                             mask_id=mask)
            views.append((pick, inp))
        return views

    def rule_step(self, rows: Tensor, logits: Tensor, canvas: Tensor | None = None,
                  exclude: Tensor | None = None, steps: Tensor | None = None,
                  scheduler: Scheduler | None = None) -> tuple[Tensor, Tensor]:
        """One step of the base rule (or `scheduler`) for `rows` on `canvas`: the (b, W) canvas
        after it and the (b, W) bool columns it committed."""
        x = (self.x[rows] if canvas is None else canvas).clone()
        committed = torch.zeros_like(x, dtype=torch.bool)
        rule = scheduler or self.config.scheduler
        for pick, inp in self.view(rows, logits, x, exclude, steps):
            decision, _ = rule.select(inp, None)
            resolved = resolve(inp, decision)
            x[pick, self.gen_start:] = write(inp.current, resolved, self.model.mask_token_id)
            committed[pick, self.gen_start:] = resolved.commit
        return x, committed

    # ---- the result ---------------------------------------------------------------------
    def result(self, extra: dict[str, Any] | None = None) -> SpecDecode:
        """The decode, with every counter per sample."""
        eos = tuple(self.model.eos_token_ids)
        g = self.gen_start
        tokens = self.x[:, g:g + self.config.gen_length].cpu()
        is_eos = torch.isin(tokens, torch.tensor(eos))
        answer = torch.where(is_eos.any(-1), is_eos.int().argmax(-1), tokens.shape[1])
        text = None
        if self.tokenizer is not None:
            text = [self.tokenizer.decode(row[:int(n)].tolist(), skip_special_tokens=True).strip()
                    for row, n in zip(tokens, answer)]
        result = DecodeResult(tokens=tokens, nfe=self.counters.forwards.clone(), answer_lengths=answer,
                              seconds=time.perf_counter() - self.started, text=text,
                              forward_rows=self.counters.rows.clone())
        return SpecDecode(result, self.counters.verifies.clone(), self.counters.fed.clone(), dict(extra or {}))


@dataclass
class SpecDecode:
    """What a self-speculative decoder returns.

    Attributes:
        result: the decode (`DecodeResult`: `nfe` counts every forward, verification forwards
            included; `forward_rows` the canvases those forwards computed).
        verifies: (B,) the forwards that verified drafts.
        tokens_fed: (B,) token columns those forwards fed (query copies included).
        stats: decoder-specific totals (accepted tokens, rounds, ...).
    """

    result: DecodeResult
    verifies: Tensor
    tokens_fed: Tensor
    stats: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        r = self.result
        return {"tokens": r.tokens.tolist(), "text": r.text, "nfe": r.nfe.tolist(),
                "forward_rows": r.forward_rows.tolist(), "verifies": self.verifies.tolist(), "tokens_fed": self.tokens_fed.tolist(),
                "answer_lengths": r.answer_lengths.tolist(), "seconds": r.seconds, **self.stats}
