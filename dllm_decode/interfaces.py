"""Contracts between the loop and its parts: the model, schedulers, caches and filters.

The only implementation here is `NoCache`, the exact default every decode starts from;
`dllm_decode.schedulers`, `.caches`, `.filters` and `dllm_decode.models` hold the others. Shapes use the letters of `dllm_decode/__init__.py`; `W` is the width of the step's
window (the canvas columns the step has logits for, see `StepInput`).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from torch import Tensor

from dllm_decode.fields import Checked
from dllm_decode.ops import argmax_mask


@runtime_checkable
class DiffusionLM(Protocol):
    """A masked denoiser: logits for every position of a canvas, row i predicting the token AT i.

    `forward(input_ids, attention_mask=None, positions=None, kv=None, rows=None)`:
      input_ids:      (B, L) long, the whole canvas; for a model with `trimmable = True` the loop
                      cuts off a tail no row attends any more (end-of-text truncation), so L may
                      shrink during a decode. Models whose logits depend only on attended columns
                      and on positions counted from the left (every adapter here) set it; a model
                      that locates the generation region from the canvas end must not.
      attention_mask: (B, L) 1 for real tokens, 0 for padding or dropped columns (never attended).
      positions:      (B, L) long rotary/absolute positions; default `cumsum(mask) - 1`, so a
                      left-padded row sees exactly the positions of the unpadded one.
      kv:             a `KVCache` (models with `supports_kv = True` only). Empty: compute every
                      row and store each layer's K/V. Filled: compute only `rows`, attending to the
                      cached K/V of every other column, and write the fresh K/V of `rows` in place.
      rows:           (start, end) canvas columns whose logits are returned (default all).
    Returns float logits (B, end - start, V).
    """

    mask_token_id: int
    eos_token_ids: tuple[int, ...]
    vocab_size: int
    max_length: int | None

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                positions: Tensor | None = None, kv: Any = None,
                rows: tuple[int, int] | None = None) -> Tensor: ...


@dataclass(frozen=True)
class StepInput:
    """Everything a scheduler or filter may look at for one denoising step. Built only by
    `dllm_decode.step.step_input` (the loop, the reference loop and every tool that shows a rule
    a view), which derives `eligible`, `confidence`, `live` and `revisable` from the rest.

    The window is the canvas columns `[offset, offset + W)` the step has logits for: the active
    block and everything after it without a cache or with the prefix cache, the block alone under
    the dual cache. Only `eligible` positions (masked, inside the row's active block, not predicted
    as [MASK]) may be committed.

    Attributes:
        step: 0-based step within the current block.
        num_steps: the block's step budget (its length): fixed-step schedules divide by it.
        offset: canvas column of window column 0.
        block: (B, 2) long, each row's active block `[start, end)` in canvas columns.
        gen_span: (B, 2) long, each row's generation region `[start, end)` (shrinks under EoTP).
        is_masked: (B, W) bool, still masked anywhere in the window.
        eligible: (B, W) bool, may be committed this step.
        candidates: (B, W) long, proposed token per column (argmax, or Gumbel sample if T > 0).
        confidence: (B, W) float32, probability of the candidate under the clean softmax, -inf
            where not eligible.
        probs: (B, W, V) float32 softmax of `logits`.
        logits: (B, W, V) float32 processed logits.
        live: (B,) bool, rows with work in this step (rows whose block is already done wait for
            the others and are never eligible).
        current: (B, W) long, the window's tokens as they stand ([MASK] where masked).
        revisable: (B, W) bool, committed columns the scheduler may re-mask or edit this step
            (its `revises` scope; all False for schedulers that never revise).
        generator: the request's random generator (for random scores), or None.
        eos_ids: the model's end-of-text token ids (EoTP and EOS-aware rules read them here
            instead of hard-coding them).
        mask_id: the model's [MASK] id (never written).
        excluded: (B, W) bool columns this step may not commit at all, not even by an all-in
            `finish` (a token-shifted block model's block start is committed alone in its
            block's first step), or None.
        lookahead_entropy: (B, N, W') float32, for a rule with `lookahead_candidates > 0` whose
            `lookahead` proposed actions: the entropy (nats) at each column of each candidate
            canvas (the row's canvas with that action written), from window column 0 to the
            canvas end (W' >= W), +inf where that canvas is not masked or the action is empty.
            None when the loop ran no look-ahead (a tool that runs no extra forwards).
        lookahead_top: (B, N, W') long, beside `lookahead_entropy`: each candidate canvas's
            argmax token at each column ([MASK] excluded; [MASK] for a candidate not run).
        lookahead_top_prob: (B, N, W') float32, that token's probability (0 where not run).
        guide_logits: (B, W, V) float32, for a rule that names a `guide` model: the causal
            guide's log-probabilities for each window column given every column before it, with
            each masked window column replaced by its candidate (the draft); -inf on ids the
            guide does not share and on [MASK]. None when no guide ran.
        noise: (B, W, V) float64, for a rule with `needs_noise`: the noise `T * Gumbel` the
            candidates were drawn with (`candidates = argmax(logits + noise)`), so the rule can
            sample another distribution with the same draw. None at temperature 0.
    """

    step: int
    num_steps: int
    offset: int
    block: Tensor
    gen_span: Tensor
    is_masked: Tensor
    eligible: Tensor
    candidates: Tensor
    confidence: Tensor
    probs: Tensor
    logits: Tensor
    live: Tensor
    current: Tensor | None = None
    revisable: Tensor | None = None
    generator: torch.Generator | None = None
    eos_ids: tuple[int, ...] = ()
    mask_id: int = -1
    excluded: Tensor | None = None
    lookahead_entropy: Tensor | None = None
    lookahead_top: Tensor | None = None
    lookahead_top_prob: Tensor | None = None
    guide_logits: Tensor | None = None
    noise: Tensor | None = None

    @property
    def columns(self) -> Tensor:
        """(W,) canvas column of each window column."""
        return torch.arange(self.offset, self.offset + self.is_masked.shape[1],
                            device=self.is_masked.device)


@dataclass(frozen=True)
class Decision:
    """What a scheduler (then each filter) decides for one step.

    Attributes:
        commit: (B, W) bool, positions to write. The loop keeps only eligible ones and forces the
            most confident eligible position of a row that commits nothing.
        tokens: (B, W) long values to write; None means `StepInput.candidates`.
        finish: (B,) bool "all-in" (Prophet): commit every masked window column of the row with
            `tokens` now. None means no row finishes.
        truncate_at: (B,) long canvas column; positions at or after it become end-of-text and are
            never computed again (EoTP). None, or a value >= the row's generation end, keeps all.
        remask: (B, W) bool, committed columns to take back (return to [MASK]). Only a scheduler
            whose `revises` scope allows it may set it; the loop keeps only `revisable` columns
            and at most (commits this step - 1) per row, the least supported first, so every step
            still leaves one mask fewer.
        edit: (B, W) bool, committed columns to overwrite with `tokens` (token-to-token editing),
            under the same scope; the loop ignores edits that change nothing.
    """

    commit: Tensor
    tokens: Tensor | None = None
    finish: Tensor | None = None
    truncate_at: Tensor | None = None
    remask: Tensor | None = None
    edit: Tensor | None = None

    def resolve(self, inp: StepInput, force: bool = True) -> tuple[Tensor, Tensor]:
        """The (B, W) commits and tokens the loop writes, under its rules (the one place they are
        written down; EoTP reads its final commits from here too): only eligible columns (an
        all-in `finish` adds every masked column in view that is not `excluded`), never [MASK],
        and a row that has eligible columns but commits none of them commits its most confident
        one (forced progress; `force=False` for a rule with a step budget, which may make no
        progress in a step)."""
        tokens = inp.candidates if self.tokens is None else self.tokens
        commit = self.commit & inp.eligible
        if self.finish is not None:
            fill = inp.is_masked if inp.excluded is None else inp.is_masked & ~inp.excluded
            commit = commit | (self.finish.unsqueeze(-1) & fill)
        commit = commit & (tokens != inp.mask_id)
        stalled = inp.eligible.any(-1) & ~(commit & inp.eligible).any(-1) & force
        forced = argmax_mask(inp.confidence) & stalled.unsqueeze(-1)
        return commit | forced, torch.where(forced, inp.candidates, tokens)


class Scheduler(Checked, abc.ABC):
    """Decides which masked positions to commit at each step.

    Implementations are frozen dataclasses whose fields are their hyper-parameters, validated in
    `__post_init__`, every field defaulted. The base class checks each int/float/bool/str field
    against its annotation first (NaN and infinity refused unless listed in `infinite_ok`; see
    `dllm_decode.fields`), so `__post_init__` checks only ranges. Per-request memory is the explicit `state` threaded
    through the hooks, never an attribute, so one instance serves many requests. No hook may
    modify its inputs in place, loop over batch rows, or sync with the host.

    Class attributes:
        view: "block" when the rule looks only at the active block; "rest" when it needs logits
            for everything after the block start the cache computed (answer-region rules).
        chooses_block_bounds: True when `block_end` moves block ends (block lengths then need
            not divide the generation length).
        revises: which committed tokens the rule may take back (`Decision.remask`/`edit`):
            "none" (every commit is final, the default), "block" (committed columns of the
            active block: WINO, token editing), "generated" (any generated column before the
            block end, which also makes every masked column there eligible again: Saber; needs
            the `none` cache).
        post_steps: steps a row may keep editing after its block has no mask left (each needs
            an edit to continue; LLaDA2.1's `max_post_steps`).
        capturable: True when `select` is pure tensor work that also accepts `step`,
            `num_steps` and `offset` as 0-d device tensors (no host sync, no Python branch on
            data), so it can run inside a compiled or recorded step; a contract test compiles
            it with `fullgraph=True` for every rule that sets it.
        caches: registry names of the caches the rule accepts (None: any; a rule that revises
            "generated" accepts only "none" whatever it says).
        lookahead_candidates: > 0 when the rule proposes candidate actions in `lookahead` and
            reads their one-step look-ahead entropies (`StepInput.lookahead_entropy`); the loop
            runs one extra forward for them, counted as a forward of every row that proposed.
        guide: the causal model (a name `load_causal_lm` resolves, or "auto": the dLLM's own
            same-tokenizer partner) whose logits the rule reads (`StepInput.guide_logits`);
            each step's guide forward is counted in `guide_nfe`. None: no guide.
        needs_noise: the rule reads the candidates' sampling noise (`StepInput.noise`; it is
            materialised, W x V per row, only for rules that ask).
        canvas_kinds: what an uncommitted column may hold for the rule to run (`dllm_decode.noise`):
            "mask" ([MASK], every masked model) and/or "noise" (a random token redrawn each step,
            DiffusionGemma), where the rule chooses the columns to accept each step.
    """

    view: ClassVar[str] = "block"
    capturable: ClassVar[bool] = False
    chooses_block_bounds: ClassVar[bool] = False
    revises: ClassVar[str] = "none"
    post_steps: ClassVar[int] = 0
    caches: ClassVar[tuple[str, ...] | None] = None
    lookahead_candidates: ClassVar[int] = 0
    guide: ClassVar[str | None] = None
    needs_noise: ClassVar[bool] = False
    canvas_kinds: ClassVar[tuple[str, ...]] = ("mask",)

    def step_budget(self, block_length: int) -> int | None:
        """Steps the rule runs per block of `block_length` when it runs a fixed number that may
        exceed it (steps with no net progress: ReMDM's loop steps), or None (the default: at
        most one step per position). A budgeted rule's re-masks are not clamped to its commits,
        a row of it may commit nothing in a step, the block's step cap is the budget, and the
        rule must leave no mask at its last step."""
        return None

    def lookahead(self, inp: StepInput, state: Any) -> tuple[Tensor, Tensor, Any]:
        """For a rule with `lookahead_candidates = N > 0`, before `select`: (B, N, W) bool
        candidate actions (the columns each candidate would commit; an all-False candidate is
        not run), (B, N, W) long tokens they would write, and the new state."""
        raise NotImplementedError(f"{type(self).__name__} declares no look-ahead")

    def init_state(self, batch_size: int, device: torch.device) -> Any:
        """A new request (batch of rows) starts. Stateless rules keep the default."""
        return None

    def check_fits(self, vocab_size: int, gen_length: int) -> None:
        """Raise a one-line `ValueError` when the settings cannot serve a model of `vocab_size`
        tokens and a canvas of `gen_length` (token ids the rule names outside the vocabulary, a
        reference of another length). Called once per request, before any work; rules that
        name no ids keep the default."""

    def check_config(self, config: Any) -> None:
        """Raise a one-line `ValueError` when the rule's fields contradict the decode record it
        is part of (`DecodeConfig`: a sub-block that does not tile the canvas). Called by
        `DecodeConfig.__post_init__`, so every entry point checks it."""

    def block_end(self, inp: StepInput, state: Any) -> tuple[Tensor | None, Any]:
        """At step 0 of a block: (B,) canvas column where this block ends, or None for the default.

        `inp` is the block's first view; the window then covers at least the rest of the canvas.
        """
        return None, state

    def process_logits(self, inp: StepInput, state: Any) -> tuple[Tensor | None, Any]:
        """Return replacement (B, W, V) logits (the loop recomputes candidates and confidence from
        them) or None to keep them."""
        return None, state

    @abc.abstractmethod
    def select(self, inp: StepInput, state: Any) -> tuple[Decision, Any]:
        """The rule: a `Decision` for this step and the new state. Must not modify `inp`."""

    def select_rows(self, state: Any, rows: Tensor) -> Any:
        """Keep only batch `rows` of the state (the loop drops finished rows). Tensors whose first
        dimension is the batch are indexed; override for other layouts."""
        return _index_rows(state, rows)


class Filter(Checked, abc.ABC):
    """Runs after the scheduler, like a logits-processor list: vetoes or adds commits, or truncates.

    Frozen dataclass, same rules as `Scheduler`. Filters are stateless.
    """

    view: ClassVar[str] = "block"

    @abc.abstractmethod
    def __call__(self, inp: StepInput, decision: Decision) -> Decision:
        """Return the (possibly changed) decision. Must not modify its inputs."""


@dataclass(frozen=True)
class StepPlan:
    """Which canvas rows one step computes, decided on the host before the forward, from the
    block and the step alone (`Cache.plan`); an executor runs it (the cache's own eager forward,
    or the captured step).

    Attributes:
        rows: `(a, b)` canvas rows whose logits the step returns, `a <=` the block start.
        rebuild: the K/V start afresh: the forward computes every column before `b` (a full
            refresh); else it computes `rows` only (a token-shifted family's look-back row too)
            against the K/V kept from earlier steps.
        restart: the first column the next step must compute again (its K/V were written before
            this step's commits); the next plan receives it.
    """

    rows: tuple[int, int]
    rebuild: bool
    restart: int


class Cache(Checked, abc.ABC):
    """How the loop obtains logits for the active block (none, prefix, dual).

    Frozen dataclass (its fields are the refresh policy) plus an explicit state from `init_state`.

    A cache whose rows follow from the block and the step (`capturable = True`) says which in
    `plan`, and its `logits` runs that plan eagerly; the captured step runs the same plan, so its
    refresh rules are written once, here. A cache that chooses rows from the data (confidences,
    attention) keeps `capturable = False` and always runs eagerly.
    """

    capturable: ClassVar[bool] = False
    prefix_reuse: ClassVar[str | None] = None
    rows_apart: ClassVar[bool] = False
    """Each row's logits depend on that row alone and, with no state (None), the cache keeps
    nothing per row: the loop may feed only the rows with work (`canvas.MaskCanvas.logits`)."""
    """How the cross-request prefix cache (`dllm_decode.prefix_reuse`) may seed a new batch's
    state with stored K/V of earlier requests' prefixes: "exact" (the K/V of a finished prefix
    never change, a block-causal model's), "approximate" (prompt K/V reused on any model, only
    when the engine opts in) or None (never). A cache that sets it implements `resume` and
    `kv_of`."""
    own_windows: ClassVar[bool] = False
    """`logits` takes `rows=`, each row's own block (`dllm_decode.row_windows.RowWindows`), and
    keeps, for each row, what it keeps for that row alone: the step's shared window (every row's
    block together) does not change the row's cached state outside its own (a request joining
    rows that are in a later block leaves their tokens as they are)."""
    mid_run_joins: ClassVar[bool] = True
    """A request may join a running batch whose rows are part-way through their decode. False:
    the cache keeps batch-wide state (refresh counters, a full forward when rows join) that a
    newcomer would change for the running rows, so `Decoding` admits newcomers only once every
    row has finished (`Decoding.accepts_joins`), and the engine starts another running batch."""

    def init_state(self, model: DiffusionLM) -> Any:
        return None

    def resume(self, kv: Any, restart: int) -> Any:
        """A state whose `KVCache` `kv` already holds every column before `restart` (for every
        row), so the next step computes from `restart` on. Only where `prefix_reuse` is set."""
        raise NotImplementedError(f"{type(self).__name__} takes no stored K/V")

    def kv_of(self, state: Any) -> Any:
        """The `KVCache` inside a state (None when it holds none yet)."""
        return None

    def plan(self, block: tuple[int, int], block_step: int, length: int,
             restart: int | None) -> StepPlan:
        """The rows of the next step over a canvas of `length` columns (`restart`: the last
        plan's, or None when nothing is cached: the batch's first forward). Only for
        `capturable` caches."""
        raise NotImplementedError(f"{type(self).__name__} chooses its rows from the data: it has no plan")

    @abc.abstractmethod
    def logits(self, model: DiffusionLM, canvas: Tensor, attention_mask: Tensor,
               block: tuple[int, int], block_step: int, state: Any) -> tuple[Tensor, int, Any]:
        """Logits for (at least) the active block. An `own_windows` cache also takes `rows=`,
        each row's own block (`dllm_decode.row_windows.RowWindows`).

        Args:
            canvas: (B, L) long, the live rows of the whole canvas.
            attention_mask: (B, L) long.
            block: `(start, end)` canvas columns covering every live row's active block.
            block_step: 0 at the first step of a block (where a refresh is due).
        Returns:
            (B, W, V) logits, the canvas column of window column 0 (<= start), and the new state.
        """

    def select_rows(self, state: Any, rows: Tensor) -> Any:
        return _index_rows(state, rows)

    def fresh(self, state: Any) -> Tensor | None:
        """(B, W) bool over the last `logits` window: the columns whose logits that call
        computed; the loop lets a row commit only there. None (the default): every column."""
        return None

    def admit(self, state: Any, model: DiffusionLM) -> Any:
        """The state once requests joined the running batch (their rows appended after the
        kept ones): by default a fresh one (the cache starts afresh)."""
        return self.init_state(model)

    def report(self, state: Any) -> dict[str, Tensor] | None:
        """What the last step did, per batch row, for the step trace: (B,) counts such as
        `refreshed_layers` and `recomputed` (columns), or None (the default: nothing to say)."""
        return None

    def trim(self, state: Any, width: int) -> Any:
        """Keep the first `width` canvas columns of the state: the loop cut off a tail that no
        row attends any more (end-of-text truncation). A cache that keeps per-column tensors in
        another form must override this."""
        return state.trim(width) if hasattr(state, "trim") else state


@dataclass(frozen=True)
class NoCache(Cache):
    """No cache: a full forward over the whole canvas every step (the exact reference), logits
    from the block start to the canvas end. Registered as the `none` cache.

    Its state is the model's attention back end's per-request state (`models.attention`; None
    for dense attention), handed to each forward as `kv`; rows that join keep the others'.
    """

    capturable: ClassVar[bool] = True
    rows_apart: ClassVar[bool] = True

    def init_state(self, model: DiffusionLM) -> Any:
        from dllm_decode.models.attention import attention_state

        return attention_state(model)

    def plan(self, block: tuple[int, int], block_step: int, length: int,
             restart: int | None) -> StepPlan:
        return StepPlan((block[0], length), rebuild=True, restart=block[0])

    def logits(self, model: DiffusionLM, canvas: Tensor, attention_mask: Tensor | None,
               block: tuple[int, int], block_step: int, state: Any) -> tuple[Tensor, int, Any]:
        rows = self.plan(block, block_step, canvas.shape[1], None).rows
        if state is None:
            return model(canvas, attention_mask, rows=rows), rows[0], state
        state.begin(canvas, attention_mask)
        return model(canvas, attention_mask, rows=rows, kv=state), rows[0], state

    def select_rows(self, state: Any, rows: Tensor) -> Any:
        return None if state is None else state.select_rows(rows)

    def admit(self, state: Any, model: DiffusionLM) -> Any:
        return self.init_state(model) if state is None else state


def _index_rows(state: Any, rows: Tensor) -> Any:
    """Index every batch-first tensor inside a (nested) state value by `rows`."""
    if isinstance(state, Tensor):
        return state.index_select(0, rows.to(state.device)) if state.dim() else state
    if isinstance(state, dict):
        return {key: _index_rows(value, rows) for key, value in state.items()}
    if isinstance(state, (list, tuple)) and not hasattr(state, "_fields"):
        return type(state)(_index_rows(value, rows) for value in state)
    if hasattr(state, "_fields"):                       # NamedTuple
        return type(state)(*(_index_rows(value, rows) for value in state))
    return state
