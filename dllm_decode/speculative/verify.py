"""Verification of one draft against one target forward: greedy matching and speculative sampling.

Both take the g drafted tokens and the target's g + 1 next-token distributions (row i predicts the
token after draft i - 1; the last row is the bonus position) and return the tokens to append:
the accepted drafts followed by exactly one target token (the correction at the first rejection,
or the bonus token when every draft passes). Pure tensor functions, one host sync each.
"""

from __future__ import annotations

import torch
from torch import Tensor


def leading_run(flags: Tensor) -> int:
    """Length of the leading run of True in a (g,) bool tensor (the round's one host sync)."""
    return int(flags.long().cumprod(0).sum()) if flags.numel() else 0


def greedy_verify(drafts: Tensor, target_logits: Tensor) -> tuple[Tensor, int]:
    """Accept the longest prefix where draft == target argmax, then append the target's argmax.

    Equals plain greedy decoding in exact arithmetic (Leviathan et al. 2023 §2; HF
    `_assisted_decoding` "Case 2": `n_matches = ((~(candidates == selected)).cumsum(-1) < 1).sum()`).

    Args:
        drafts: (g,) long drafted tokens, g >= 0.
        target_logits: (g + 1, V) target logits after the context and after each draft.
    Returns:
        (n + 1,) long tokens to append and n, the number of accepted drafts.
    """
    best = target_logits.argmax(-1)                      # first index on ties, as plain greedy
    n = leading_run(drafts == best[:-1])
    return best[:n + 1], n


def speculative_verify(drafts: Tensor, draft_probs: Tensor | None, target_probs: Tensor,
                       generator: torch.Generator | None) -> tuple[Tensor, int]:
    """Modified rejection sampling: the appended tokens are distributed exactly as the target's.

    Leviathan et al. 2023 Alg. 1 / Chen et al. 2023: accept draft i with probability
    min(1, p_i(x_i) / q_i(x_i)); at the first rejection sample from norm(max(0, p_i - q_i)) and
    stop; if all g pass, sample a bonus token from p_{g+1}. A deterministic drafter (prompt lookup,
    argmax dLLM unmasking) passes `draft_probs=None`: q is one-hot, so draft i is kept with
    probability p_i(x_i) and the residual is p_i without x_i (spec §1.3; vLLM's
    `draft_probs is None` path). `r < ratio` (not `<=`) so a token with p = 0 is never accepted.

    Args:
        drafts: (g,) long drafted tokens.
        draft_probs: (g, V) float the distributions the drafts were sampled from (after the same
            temperature/top-k/top-p as the target), or None for a deterministic drafter.
        target_probs: (g + 1, V) float warped target distributions.
        generator: the only source of randomness.
    Returns:
        (n + 1,) long tokens to append and n, the number of accepted drafts.
    """
    g = drafts.shape[0]
    rows = torch.arange(g, device=drafts.device)
    p = target_probs.double()
    if draft_probs is None:
        q = torch.nn.functional.one_hot(drafts, p.shape[-1]).double()
    else:
        q = draft_probs.double()
    ratio = p[rows, drafts] / q[rows, drafts].clamp_min(torch.finfo(torch.float64).tiny)
    r = torch.rand(g, dtype=torch.float64, device=drafts.device, generator=generator)
    n = leading_run(r < ratio)
    if n < g:
        residual = (p[n] - q[n]).clamp_min(0.0)
        # p <= q everywhere only up to rounding (a rejection needs p(x) < q(x), hence mass
        # elsewhere); fall back to p itself rather than divide by zero.
        total = residual.sum()
        last = torch.where(total > 0, residual / total.clamp_min(torch.finfo(torch.float64).tiny), p[n])
    else:
        last = p[g]
    token = torch.multinomial(last, 1, generator=generator)
    return torch.cat([drafts[:n], token]), n
