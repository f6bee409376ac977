"""Verifying a drafted chain left to right: greedy match, or speculative sampling with a residual
draw (what S2D2's ratio acceptance and SimSD's MRS share)."""

from __future__ import annotations

import torch
from torch import Tensor


def accept_chain(draft: Tensor, p: Tensor, q_logits: Tensor, mask_id: int, *, greedy: bool,
                 generator: torch.Generator | None, gamma: float = 1.0, top_p: float = 1.0,
                 resample: bool = True) -> tuple[Tensor, int]:
    """Verify a chain of drafted tokens (n,) left to right against the verifier's logits (n, V)
    at their columns; returns the tokens to commit from the chain's first column on and how many
    drafts were accepted.

    `greedy`: accept while the draft equals the verifier's argmax; the first mismatch commits the
    argmax (lossless w.r.t. the verifier's greedy decode). Otherwise speculative sampling: accept
    column i with probability min(1, (q_i(x_i) / p_i(x_i))^gamma), q the verifier's softmax cut
    to its `top_p` nucleus and p (n, V) the draft's law, uniforms from `generator`; the first
    rejection commits a draw from norm(max(0, q - p)) (`resample`; q when that is empty), or
    nothing (the accepted prefix alone, possibly empty). [MASK] is never the verifier's token.
    """
    q_logits = q_logits.float().index_fill(-1, torch.tensor([mask_id], device=q_logits.device),
                                           torch.finfo(torch.float32).min)
    if greedy:
        target = q_logits.argmax(-1)
        miss = (target != draft).nonzero()
        n = int(miss[0]) if miss.numel() else len(draft)
        return torch.cat([draft[:n], target[n:n + 1]]), n
    q = top_p_law(q_logits.softmax(-1), top_p)
    q_sel = q.gather(-1, draft[:, None]).squeeze(-1)
    p_sel = p.gather(-1, draft[:, None]).squeeze(-1).clamp_min(1e-12)
    ratio = ((q_sel / p_sel) ** gamma).clamp(max=1.0)
    uniform = torch.rand(len(draft), generator=generator, device=draft.device)
    reject = (uniform >= ratio).nonzero()
    if not reject.numel():
        return draft, len(draft)
    n = int(reject[0])
    if not resample:
        return draft[:n], n
    residual = (q[n] - p[n]).clamp_min(0)
    law = residual if float(residual.sum()) > 0 else q[n]
    return torch.cat([draft[:n], torch.multinomial(law / law.sum(), 1, generator=generator)]), n


def top_p_law(probs: Tensor, top_p: float) -> Tensor:
    """The nucleus law: the smallest most-probable set reaching `top_p`, renormalised (S2D2's
    `_probs_from_logits`)."""
    if top_p >= 1:
        return probs
    ordered, index = probs.sort(-1, descending=True)
    drop = ordered.cumsum(-1) > top_p
    drop[..., 1:] = drop[..., :-1].clone()
    drop[..., 0] = False
    kept = probs.masked_fill(torch.zeros_like(drop).scatter(-1, index, drop), 0)
    return kept / kept.sum(-1, keepdim=True).clamp_min(1e-12)
