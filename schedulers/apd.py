"""APD: adaptive parallel decoding with a small autoregressive verifier (Israel, Van den Broeck
and Grover, NeurIPS 2025, arXiv 2506.00413; reference `danielmisrael/apd`,
`dream/generation_utils.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dllm_decode.fields import MAX_CANVAS, bounded, file_option
from dllm_decode.interfaces import Decision, Scheduler, StepInput


@dataclass(frozen=True)
class APDScheduler(Scheduler):
    """Commit the longest prefix from the frontier on which the dLLM's draft matches the product
    of experts of the dLLM and a causal guide.

    Per row and step: the frontier f is the first masked column of the block; the draft is the
    loop's candidates x_j at the first `lookahead` masked columns from f (0: to the block end).
    The loop's guide (`verifier`, one AR forward over the canvas with the draft written) gives
    `l_AR,j = log p_AR(. | canvas_<j)`. The target is

        y_j = argmax( R * log p_D,j + (1 - R) * l_AR,j ),   R = `mixture`

    (a product of experts p_D^R p_AR^(1-R) in logit space, over the ids the two models share;
    the guide's [MASK] is -inf). Accept a_f = 1 and a_j = [x_j == y_j]; commit x at the
    longest run of accepted columns from f. R = 1 accepts the whole draft (greedy); R = 0
    accepts while the draft agrees with the AR model's greedy choice given the draft before it.

    Defaults: R = 0.7 (the reference's `demo.py` and Pareto script), M = 0 (to the block end;
    the reference's M truncates the dLLM's input at f + M, which `--cache suffix -c window=M`
    approximates), `verifier = "auto"`: the dLLM's own same-tokenizer partner (`ar_target` for
    the embedded dLLM, the reference pairs Dream-7B with Qwen2.5-0.5B). Every step's guide
    forward is counted in `guide_nfe` (the reference folds it into a timer, so its NFE
    understates the work). Set `block_length = gen_length` for the reference's single block;
    with smaller blocks the frontier lives in the active block (a generalisation).

    At temperature T > 0 the draft is the loop's sample `x = argmax(l_D + T * G)` and the target
    (Algorithm 1, `published_target = True`) is sampled with the SAME Gumbel draw G:
    `y = argmax(mix + T * G)`, so R = 1 accepts every draft token. `published_target = False` is
    the reference code's target, the mixture's argmax (its `sample_with_gumbel` runs at its
    default T = 0, a bug: a sampled draft is compared with a greedy target). At T = 0 the two
    are the same.

    Deviations: the draft's temperature is the loop's T (the reference's `exp(l/T) / (-ln u)^T`
    samples at T squared). The guide keeps an AR KV cache of the committed prefix (the columns
    before the step's window) and feeds the rest each step. The reference's W (`kv_window`, an
    approximate dLLM cache behind the frontier) maps to this toolkit's caches, all of which run.
    A stop on any end-of-text token in the canvas (the reference checks the prompt too) is the
    loop's `stop_at_eos` on finished blocks. Batch > 1 (the reference is batch 1). A view
    without guide logits (a tool that runs no guide) accepts the frontier column only.
    """

    needs_noise: ClassVar[bool] = True

    mixture: float = 0.7
    lookahead: int = bounded(0, most=MAX_CANVAS, scales="memory")
    verifier: str = file_option("auto")            # start-up only: loads a model
    published_target: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.mixture <= 1.0:
            raise ValueError(f"mixture must be in [0, 1], got {self.mixture}")
        if self.lookahead < 0:
            raise ValueError(f"lookahead must be >= 0 (0: to the block end), got {self.lookahead}")
        if not self.verifier.strip():
            raise ValueError("verifier must name a causal model (auto, ar_target, ar_draft, a directory)")

    @property
    def guide(self) -> str:                                  # type: ignore[override]
        return self.verifier

    def select(self, inp: StepInput, state: Any) -> tuple[Decision, Any]:
        eligible = inp.eligible
        rank = eligible.long().cumsum(-1)                   # 1 at the frontier
        draft = eligible & ((rank <= self.lookahead) if self.lookahead else torch.ones_like(eligible))
        frontier = eligible & (rank == 1)
        if inp.guide_logits is None:
            agree = torch.zeros_like(eligible)
        else:
            own = inp.logits.log_softmax(-1)
            if self.mixture == 1.0:
                mixed = own
            elif self.mixture == 0.0:
                mixed = inp.guide_logits
            else:
                mixed = self.mixture * own + (1 - self.mixture) * inp.guide_logits
            if self.published_target and inp.noise is not None:   # the draft's own Gumbel draw
                mixed = mixed.double() + inp.noise
            agree = inp.candidates == mixed.argmax(-1)
        stop = (draft & ~(agree | frontier)) | (eligible & ~draft)
        commit = draft & (stop.long().cumsum(-1) == 0)
        return Decision(commit=commit), state

