"""The running batch as one record: its members (requests), their rows, bounds and phase tensors.

`Batch` holds every member (`dllm_decode.member.Member`) still decoding and does the batch
geometry: admission between phases (rows appended, everyone right-aligned to one
canvas), compaction of finished members, dropping finished rows, trimming a canvas tail no row
attends. `Phase` is the device-side copy of the bounds the step reads, built at phase start and
at every row change, then updated in place (preallocated tensors, the same ones every step), so
a step allocates no bookkeeping tensors of its own. Features plug in through the step's records
(`dllm_decode.records`) and the executors, never as copies of this code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode.batch import Bounds, Rows
from dllm_decode.member import Member
from dllm_decode.models.block_grid import block_start_columns
from dllm_decode.records import Outcome, Progress, Settled
from dllm_decode.step import Resolved, Window, truncate, write


@dataclass
class Phase:
    """The bounds on the device, one row each, in batch order (see `Bounds`).

    Attributes:
        columns: (L,) canvas column numbers.
        block: (b, 2) each row's active block.
        gen_span: (b, 2) each row's generation region.
        region_start: (b,) the first column each row may commit in.
        revising: (b,) bool, the row runs an edit pass.
        index: member -> (b_m,) its rows' batch positions (None: it holds every row).
    Rows lie member by member, in member order (admission appends, drops and compaction keep
    the order), so the members' rows concatenated are the batch in order.
    """

    columns: Tensor
    block: Tensor
    gen_span: Tensor
    region_start: Tensor
    revising: Tensor
    index: dict[int, Tensor | None]
    key: tuple = ()

    @classmethod
    def build(cls, batch: Batch) -> Phase:
        """Allocate the tensors for the batch's rows as they are now."""
        device, everyone = batch.device, list(range(len(batch)))
        index = {g: None if rows == everyone else torch.tensor(rows, device=device)
                 for g, rows in batch.groups.items()}
        long = lambda *shape: torch.zeros(shape, dtype=torch.long, device=device)   # noqa: E731
        phase = cls(torch.arange(batch.rows.x.shape[1], device=device), long(len(batch), 2),
                    long(len(batch), 2), long(len(batch)), long(len(batch)).bool(), index)
        phase.update(batch.bounds, batch.region_starts(), force=True)
        return phase

    def update(self, b: Bounds, region_starts: list[int], force: bool = False) -> None:
        """Copy the host bounds in, in place, when they changed (a block start, a truncation,
        an edit pass): one small host-to-device copy, no sync."""
        key = (tuple(b.start), tuple(b.end), tuple(b.gen_start), tuple(b.gen_end),
               tuple(region_starts), tuple(b.revising))
        if key == self.key and not force:
            return
        self.key = key
        values = torch.tensor([b.start, b.end, b.gen_start, b.gen_end, region_starts,
                               [int(r) for r in b.revising]], dtype=torch.long)
        values = values.to(self.block.device, non_blocking=True)
        self.block.copy_(values[0:2].T)
        self.gen_span.copy_(values[2:4].T)
        self.region_start.copy_(values[4])
        self.revising.copy_(values[5].bool())


class Batch:
    """Every request still decoding: `members`, their rows' canvas (`rows`, device), bounds
    (`bounds`, host), each member's rows (`groups`) and the phase tensors (`phase`)."""

    def __init__(self, device: torch.device, mask_id: int, pad_id: int):
        self.device, self.mask_id, self.pad_id = device, mask_id, pad_id
        self.members: list[Member] = []
        self.rows: Rows | None = None
        self.bounds = Bounds()
        self.groups: dict[int, list[int]] = {}
        self.phase: Phase | None = None

    def __len__(self) -> int:
        return len(self.bounds)

    def admit(self, pending: list[tuple[Member, Tensor, Tensor | None, list[list[int]]]]) -> None:
        """Finished members leave the table, pending ones join: their rows appended, every row
        right-aligned to one canvas (the narrower side gains left padding)."""
        self.compact()
        for member, canvas, mask, ids in pending:
            n = canvas.shape[0]
            index = len(self.members)
            self.members.append(member)
            member.state = member.config.scheduler.init_state(n, self.device)
            slot = torch.arange(n, device=self.device)
            revising = member.revises != "none"
            if self.rows is None or not len(self):
                counts = torch.zeros_like(canvas, dtype=torch.int32) if revising else None
                self.rows, self.bounds = Rows(canvas, mask, slot, counts), Bounds()
            else:
                self.bounds.shift(max(0, canvas.shape[1] - self.rows.x.shape[1]))
                revising = revising or self.rows.revisions is not None
                self.rows = self.rows.append(canvas, mask, slot, revising, self.pad_id)
            width = self.rows.x.shape[1]       # a block model's canvas runs past G to its grid
            gen_start = width - canvas.shape[1] + member.out.shape[1] - member.gen_length
            self.bounds.extend(Bounds([index] * n, [len(row) for row in ids], [gen_start] * n,
                                      [width] * n, [gen_start] * n, [gen_start] * n, [0] * n,
                                      [False] * n, [True] * n))
        self._regroup()

    def compact(self) -> None:
        """Drop finished members from the table (their results live on in the caller)."""
        keep = [i for i, m in enumerate(self.members) if m.live]
        if len(keep) == len(self.members):
            return
        renumber = {old: new for new, old in enumerate(keep)}
        self.members = [self.members[i] for i in keep]
        self.bounds.request = [renumber[r] for r in self.bounds.request]
        self._regroup()

    def start_phase(self, grid: bool) -> dict[int, int]:
        """Every row moves on to its next block; returns each member's step budget."""
        self.bounds.advance([self.members[r].config.block_length for r in self.bounds.request], grid=grid)
        self.phase.update(self.bounds, self.region_starts())
        return {g: self.bounds.budget(rows) for g, rows in self.groups.items()}

    def rebound(self, g: int, ends: list[int]) -> int:
        """Member `g`'s rows end their blocks at `ends` (clamped to at least one column and to
        the generation end); returns its new step budget."""
        b = self.bounds
        for r, e in zip(self.groups[g], ends):
            b.end[r] = max(b.start[r] + 1, min(int(e), b.gen_end[r]))
        self.phase.update(b, self.region_starts())
        return b.budget(self.groups[g])

    def span(self, grid: int | None) -> tuple[int, int]:
        """The canvas columns `[lo, hi)` the step needs logits for: every row's region start to
        its block end, widened to whole model blocks for a block-causal model of `grid`."""
        b, starts = self.bounds, self.region_starts()
        if grid is None:
            return min(starts), max(b.end)
        spans = [b.grid_span(i, s, e, grid) for i, (s, e) in enumerate(zip(starts, b.end))]
        return min(s for s, _ in spans), max(e for _, e in spans)

    def window(self, logits: Tensor, offset: int, hi: int, block_start_model: Any = None,
               fresh: Tensor | None = None) -> Window:
        """The step's `Window` from the cache's logits (from canvas column `offset`): cut at `hi`
        unless a member's rule or filter looks at the rest (`view = "rest"`). Its tensors are
        copies: a view a scheduler keeps never changes under it. `block_start_model` (at a
        block's first step): a token-shifted block model commits a block's first column alone
        (`models.block_grid.block_start_columns`). `fresh` (`Cache.fresh`): the only columns
        whose logits the cache computed this step, so the only ones a row may commit."""
        wide = any(m.config.scheduler.view == "rest" or any(f.view == "rest" for f in m.config.filters)
                   for m in self.members if m.live)
        if not wide and offset + logits.shape[1] > hi:
            logits = logits[:, :hi - offset]
        columns = slice(offset, offset + logits.shape[1])
        revisions = None if self.rows.revisions is None else self.rows.revisions[:, columns]
        p, tokens = self.phase, self.rows.x[:, columns].clone()
        allowed = None
        if block_start_model is not None:
            b = self.bounds
            allowed = block_start_columns(block_start_model, tokens == self.mask_id, p.columns[columns],
                                          p.block[:, :1], [b.position(i, s) for i, s in enumerate(b.start)])
        if fresh is not None:
            fresh = fresh[:, :logits.shape[1]]
            allowed = fresh if allowed is None else allowed & fresh
        return Window(offset, logits, tokens, p.block.clone(), p.gen_span.clone(),
                      p.region_start.clone(), revisions, allowed)

    def region_starts(self) -> list[int]:
        """First column each row may commit in: its block start, or its generation start under a
        scheduler that takes back earlier blocks."""
        b = self.bounds
        return [g if self.members[r].revises == "generated" else s
                for r, g, s in zip(b.request, b.gen_start, b.start)]

    def rows_of(self, member: Member) -> list[int]:
        """A member's rows' batch positions (empty when it holds none)."""
        return next((rows for g, rows in self.groups.items() if self.members[g] is member), [])

    def store(self, canvas: Tensor, rows: list[int], member: Member) -> None:
        """Write rows' generation regions (rows of one member share their generation start) into
        the member's canvas slots; a trimmed tail is end-of-text. No host sync."""
        index = torch.tensor(rows, device=self.device)
        start = self.bounds.gen_start[rows[0]]
        region = self.rows.x[index, start:start + member.gen_length]
        slots = self.rows.slot[index]
        first = canvas.shape[1] - member.gen_length
        canvas[slots, first:] = self.pad_id
        canvas[slots, first:first + region.shape[1]] = region

    def snapshot(self, member: Member, decoding: bool) -> tuple[Tensor, Tensor]:
        """A member's generation region as it stands, on the CPU (see `Decoding.snapshot`): its
        rows' canvases (`decoding`: still in the batch) and each row's final prefix length."""
        canvas, rows = member.out.clone(), self.rows_of(member) if decoding else []
        if rows:
            self.store(canvas, rows, member)
        tokens = canvas[:, -member.gen_length:].cpu()
        still = tokens == self.mask_id
        return tokens, torch.where(still.any(-1), still.int().argmax(-1), tokens.shape[1])

    def drop(self, done: list[bool], store: bool = True) -> Tensor:
        """Rows marked `done` leave (their canvases go to their members' `out` when `store`);
        the members' scheduler states keep only their remaining rows. Returns the kept rows."""
        for g, rows in self.groups.items():
            gone = [i for i in rows if done[i]]
            if not gone:
                continue
            member = self.members[g]
            member.live -= len(gone)
            if store:
                self.store(member.out, gone, member)
            local = [j for j, i in enumerate(rows) if not done[i]]
            member.state = member.config.scheduler.select_rows(
                member.state, torch.tensor(local, dtype=torch.long, device=self.device))
        kept_list = [i for i, d in enumerate(done) if not d]
        kept = torch.tensor(kept_list, dtype=torch.long, device=self.device)
        self.rows = self.rows.keep(kept)
        self.bounds = self.bounds.keep(kept_list)
        self._regroup()
        return kept

    def settle(self, progress: Progress, budgets: dict[int, int]) -> Settled:
        """The host side of a step, from its one sync (`Progress`): new ends, edit passes,
        end-of-text stops (the rest of a stopped row becomes end-of-text)."""
        block_left, gen_left, block_eos = progress.block_left, progress.gen_left, progress.block_eos
        b = self.bounds
        b.gen_end = progress.gen_end
        b.end = [min(e, g) for e, g in zip(b.end, progress.gen_end)]
        configs = [self.members[r].config for r in b.request]
        for i, (left, edited) in enumerate(zip(block_left, progress.edited)):
            budget = configs[i].scheduler.post_steps      # edit passes after the block is full:
            if budget:                                    # one after the filling step and after
                ran_post = b.revising[i]                  # each pass that edited
                b.post[i] += ran_post
                b.revising[i] = bool(not left and b.post[i] < budget and (edited or not ran_post))
        stops = [bool(self.members[r].stops_at_eos and not left and eos and not rev)
                 for r, left, eos, rev in zip(b.request, block_left, block_eos, b.revising)]
        if any(stops):
            after = self.phase.columns >= torch.tensor(b.end, device=self.device).unsqueeze(-1)
            stopped = torch.tensor(stops, device=self.device).unsqueeze(-1)
            self.rows.x = torch.where(after & stopped, self.pad_id, self.rows.x)
        b.busy = [bool(left or rev) for left, rev in zip(block_left, b.revising)]
        done = [(not left and not rev) or stop for left, rev, stop in zip(gen_left, b.revising, stops)]
        phase_over = not any(left or rev for left, rev, d in zip(block_left, b.revising, done) if not d)
        cap = max((self.members[r].config.scheduler.step_budget(budgets[r]) or budgets[r])
                  + self.members[r].config.scheduler.post_steps + 1 for r in set(b.request))
        return Settled(done, phase_over, cap)

    def write(self, offset: int, res: Resolved, truncate_at: Tensor | None) -> None:
        """The step's writes into the window's columns (one batch-wide write, revisions counted),
        then the truncations (each row's new generation end, or None)."""
        rows = self.rows
        columns = slice(offset, offset + res.commit.shape[1])
        rows.x[:, columns] = write(rows.x[:, columns], res, self.mask_id)
        if rows.revisions is not None:
            rows.revisions[:, columns] += (res.remask | res.edit).int()
        if truncate_at is not None:
            rows.x, rows.attention_mask = truncate(rows.x, rows.attention_mask, truncate_at,
                                                   self.phase.gen_span[:, 0], self.pad_id)

    def progress(self, outcome: Outcome, eos: Tensor) -> Progress:
        """The step's one host sync (`Progress`)."""
        x, p = self.rows.x, self.phase
        in_block = (p.columns >= p.region_start.unsqueeze(-1)) & (p.columns < p.block[:, 1:])
        still = x == self.mask_id
        return Progress(*torch.stack([
            (still & in_block).any(-1).long(), (still & (p.columns >= p.gen_span[:, :1])).any(-1).long(),
            (torch.isin(x, eos) & in_block).any(-1).long(), outcome.edited.long(), outcome.gen_end,
            outcome.nonfinite.long()]).tolist())

    def count(self, worked: Tensor) -> None:
        """Each member's rows that worked this step count one more forward."""
        for g, rows in self.groups.items():
            index = self.phase.index[g]
            mine = slice(None) if index is None else index
            self.members[g].nfe.index_add_(0, self.rows.slot[mine], worked[mine].long())
            self.members[g].forward_rows.index_add_(0, self.rows.slot[mine], worked[mine].long())

    def trim(self, width: int) -> bool:
        """Cut the canvas columns past `width` (no live row attends them); False if none."""
        if width >= self.rows.x.shape[1]:
            return False
        self.rows = self.rows.trim(width)
        self.phase.columns = self.phase.columns[:width]
        return True

    def _regroup(self) -> None:
        """Rebuild the member -> rows index and the phase tensors after the rows changed."""
        self.groups = {}
        for i, r in enumerate(self.bounds.request):
            self.groups.setdefault(r, []).append(i)
        self.phase = Phase.build(self) if self.rows is not None and len(self) else None
