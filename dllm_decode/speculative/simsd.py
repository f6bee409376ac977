"""SimSD: draft a whole block by diffusion, then verify every drafted token in one forward.

SimSD (Cui, Ye, Tian, ... Shang, arXiv 2606.02544; code `airevo2/SimSD-release@a77944f`,
`speculative_decoding/cache_aware.py:_verify_block_with_cache`, `speculative_decoding/mrs.py`;
whether the release is the authors' own is unverified). A draft dLLM denoises the active block
with its unmasking rule, recording the step t_i at which each column was unmasked; the target then
verifies all drafted tokens in ONE forward (data copies and [MASK] copies at duplicated
positions under a step-causal mask, so that each [MASK] copy sees the canvas the draft saw when it
unmasked its column), and the drafts are checked in position order: `greedy_match` (the release
default) accepts while the target's argmax equals the draft and commits the target's argmax at the first mismatch (the bonus); `mrs` accepts with
probability min(1, q/p) and draws the first rejected column from norm(max(0, q - p)) (q the
target's softmax, p the draft's law when the token was committed; draws from the request's
generator). The accepted prefix and the bonus are committed, the rest of the block is masked
again, and the next round drafts what is left.

Here the draft is the model itself (self-draft) under the config's rule, and the target is the same
block model in its autoregressive mode (block size 1, `blockrun.BlockRun.ar_logits`): the release
verifies with a second, larger SDAR in its diffusion view, where a self-draft is accepted whole
and saves nothing, so self-speculation takes the verifier mode S2D2 uses. Two modes:

* `strict` (default, lossless): the verification layout is position-causal (t_i = i, the spec's
  left-to-right case), with greedy match: every committed token is the AR-mode greedy token given
  the committed prefix, so the decode equals `self_decoder.ar_mode_generate` token for token (tested),
  whatever the draft proposed.
* `published`: the step-causal layout below with `acceptance` (`greedy_match` default, or
  `mrs`). It only approximates sequential decoding (the release itself calls greedy-match "an
  approximation of sequential denoising"): a column may be verified against tokens drafted at
  later positions that are then rejected. Its accuracy is reported, not assumed.

Layout for a token-shifted block model (Fast-dLLM v2, e.g. `embedded-bd`), whose column i is
predicted by row i - 1: the canvas rows of the active block attend the columns before them unmasked
no later than themselves (the release's data half, d_i -> d_j iff t_j <= t_i, made causal), and one
query copy per column i, fed after the canvas at the position of i - 1 (the release's [MASK] copies
at duplicated positions), holds the token column i - 1 had when i was drafted ([MASK] if it was
drafted later) and attends the earlier blocks, the columns before i - 1 unmasked before i, and
itself: the context the draft had for i, made autoregressive (`BlockRun.ar_logits`). A copy never
sees the token it verifies (a data row at i - 1 drafted after i would). Under a left-to-right order
the copies compute the AR-mode rows exactly (tested), so the published mode with one-column blocks
is the strict decode.

An unshifted model (SDAR, the release's family) takes the same layout with each copy at its own
column: a [MASK] at i's position, the release's m_i, made autoregressive (it attends no [MASK] copies of other
columns). Deviations: that AR-mode target (the release's m_i also attends the masks of columns
drafted later); LLaDA2 (no `verify_forward`) is refused; the EOS gate
(`_spurious_eos_bonus`) and the release's separate cache-extend forwards are absent (forwards
recompute the canvas, no cache, `blockrun`); batched with rows advancing independently (the
release's batched paths assume lock-step rows); drafting stops at the end of the active decode
block (`block_length`); [MASK] is never a draft or a bonus; the draft model is the target itself.
`forward_rows` counts canvases, `tokens_fed` the columns (query copies included).
NFE counts every draft forward and every verification forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode.config import DecodeConfig
from dllm_decode.interfaces import DiffusionLM
from dllm_decode.speculative.acceptance import accept_chain
from dllm_decode.speculative.blockrun import BlockRun, SpecDecode
from dllm_decode.speculative.self_decoder import SelfDecoder
from dllm_decode.step import propose

MODES = ("strict", "published")
ACCEPTANCE = ("greedy_match", "mrs")


@dataclass(frozen=True)
class SimSD(SelfDecoder):
    """SimSD self-speculation (see the module docstring).

    Attributes:
        mode: `strict` (position-causal layout, greedy match: lossless w.r.t. the AR-mode greedy
            decode) or `published` (the release's step-causal layout).
        acceptance: the published mode's rule, `greedy_match` or `mrs`.
    Raises:
        ValueError: an unknown mode or acceptance.
    """

    mode: str = "strict"
    acceptance: str = "greedy_match"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {list(MODES)}, got {self.mode!r}")
        if self.acceptance not in ACCEPTANCE:
            raise ValueError(f"acceptance must be one of {list(ACCEPTANCE)}, got {self.acceptance!r}")

    @property
    def strict(self) -> bool:
        return self.mode == "strict"

    @torch.inference_mode()
    def decode(self, model: DiffusionLM, prompts: Sequence[str | Sequence[int]], config: DecodeConfig,
               generator: torch.Generator | None = None, tokenizer: Any = None) -> SpecDecode:
        run, generator = BlockRun.checked("simsd", model, prompts, config, tokenizer, generator,
                                          verifier=True)
        mask, g = model.mask_token_id, run.gen_start
        rounds = drafted = accepted = 0
        while not bool(run.done.all()):
            rows = run.live()
            x, order, law, steps = self._draft(run, rows)
            span = run.in_block(rows) & (order >= 0)                     # the drafted columns
            # known columns first and causal, then the drafts by step, masks past the block last
            cols, width = run.columns(), x.shape[1]
            key = torch.where(order >= 0, order, torch.where(x == mask, 2 * width + cols, cols - width))
            q_logits = run.ar_logits(rows, x, None if self.strict else key)    # the verification
            out = run.x[rows].clone()
            for k in range(len(rows)):
                columns = span[k].nonzero().squeeze(1)
                if not columns.numel():
                    continue
                tokens, n = accept_chain(x[k, columns], law[k, columns - g], q_logits[k, columns - g], mask,
                                         greedy=self.strict or self.acceptance == "greedy_match",
                                         generator=generator)
                out[k, columns[:len(tokens)]] = tokens
                rounds, drafted, accepted = rounds + 1, drafted + len(columns), accepted + n
            run.x[rows] = out
            run.step[rows] += steps
            run.advance()
        return run.result({"rounds": rounds, "drafted": drafted, "accepted": accepted})

    def _draft(self, run: BlockRun, rows: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The base rule run to the end of each row's block: the drafted canvas (b, W), the draft
        step each column was unmasked at (-1: before the round), the draft's law at each column
        when committed (b, W - gen_start, V), and the draft steps (forwards) per row."""
        mask, g = run.model.mask_token_id, run.gen_start
        x = run.x[rows].clone()
        order = torch.full_like(x, -1)
        law = None
        steps = torch.zeros(len(rows), dtype=torch.long, device=x.device)
        going = torch.arange(len(rows), device=x.device)
        while going.numel():
            logits = run.logits(rows[going], x[going])
            probs = propose(logits, mask)[1]
            if law is None:
                law = torch.zeros(len(rows), *probs.shape[1:], device=probs.device)
            nxt, committed = run.rule_step(rows[going], logits, x[going], steps=run.step[rows[going]] + steps[going])
            x[going] = nxt
            order[going] = torch.where(committed, steps[going, None], order[going])
            law[going] = torch.where(committed[:, g:, None], probs, law[going])
            steps[going] += 1
            left = (run.in_block(rows[going]) & (x[going] == mask)).any(-1)
            going = going[left]
        return x, order, law, steps
