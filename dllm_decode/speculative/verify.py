"""Verification of one draft, a chain or a token tree, against one target forward.

The target's rows: row 0 predicts the token after the context (the root), row i + 1 the token
after node i. Verification walks down from the root and returns the accepted path (node indices)
and the tokens to append: the path's tokens followed by exactly one target token (the correction
where no child is accepted, or the bonus token after a leaf). A chain is the width-1 tree and
goes through the same walk (`greedy_verify` / `speculative_verify` are its chain entry points).

Rules:
* greedy: descend into the child equal to the target's argmax; at the first node without one,
  emit the argmax. Identical to greedy AR in exact arithmetic.
* sampling, recursive rejection (SpecInfer's multi-step speculative sampling, Miao et al. arXiv
  2305.09781; RSD's recursive rejection sampling, arXiv 2402.14160): at a node, r <- p; try the
  children in proposal order, accepting child c with probability min(1, r(c) / q_c(c)) where q_c
  is the law c was drawn from given its elder siblings, else r <- norm(max(0, r - q_c)); if every
  child is rejected, sample from r. A deterministic child has a one-hot law (r(c) accepts, the
  residual drops c: SGLang's target-only tree rule, Rule A); one child is Leviathan et al.'s rule.
  A deterministic child verified with a soft q instead is biased: proposed with certainty, it
  is accepted with probability min(1, p(c) / q(c)) > p(c) (on a two-token toy the output law
  is 0.22 away from p in total variation).
* lenient greedy (BiLD's rollback, Kim et al. arXiv 2302.07863): also descend into a child whose
  target cross-entropy -log p(c) is at most `lenience` nats; not exact (a quality knob).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from dllm_decode.speculative.tree import children_of

_TINY = torch.finfo(torch.float64).tiny


def leading_run(flags: Tensor) -> int:
    """Length of the leading run of True in a (g,) bool tensor (the round's one host sync)."""
    return int(flags.long().cumprod(0).sum()) if flags.numel() else 0


def _kids(n: int, parents: Sequence[int] | None):
    """node -> its children in proposal order (a chain: the next node)."""
    if parents is None:
        return lambda node: [node + 1] if node + 1 < n else []
    table = children_of(parents)
    return lambda node: table.get(node, [])


def greedy_tree(tokens: Tensor, parents: Sequence[int] | None, target_logits: Tensor,
                lenience: float | None = None) -> tuple[list[int], Tensor]:
    """Greedy verification of a chain (`parents=None`) or tree.

    Args:
        tokens: (n,) long drafted nodes.
        parents: the tree's parent array, or None for a chain.
        target_logits: (n + 1, V) target logits at the root and after each node.
        lenience: BiLD rollback threshold in nats (None: exact).
    Returns:
        The accepted path (node indices, root to leaf) and the (len(path) + 1,) tokens to append.
    """
    best = target_logits.argmax(-1)                      # first index on ties, as plain greedy
    wanted, drafted = best.tolist(), tokens.tolist()     # the round's host sync
    kids = _kids(len(drafted), parents)
    path: list[int] = []
    node = -1
    while True:
        row = node + 1
        options = kids(node)
        step = next((kid for kid in options if drafted[kid] == wanted[row]), None)
        if step is None and lenience is not None and options:
            logp = target_logits[row].float().log_softmax(-1)
            scores = logp[torch.tensor([drafted[k] for k in options], device=logp.device)].tolist()
            score, kid = max(zip(scores, options), key=lambda pair: (pair[0], -pair[1]))
            step = kid if -score <= lenience else None
        if step is None:
            break
        path.append(step)
        node = step
    emitted = [drafted[k] for k in path] + [wanted[node + 1]]
    return path, torch.tensor(emitted, dtype=torch.long, device=tokens.device)


def sample_tree(tokens: Tensor, parents: Sequence[int] | None, laws: Tensor | None,
                target_probs: Tensor, generator: torch.Generator | None) -> tuple[list[int], Tensor]:
    """Recursive rejection sampling over a chain or tree: the appended tokens are distributed
    exactly as the target's (given that every node was drawn from its stated law).

    Args:
        tokens: (n,) long drafted nodes.
        parents: the tree's parent array, or None for a chain.
        laws: (n, V) the law each node was drawn from (given its elder siblings; one-hot rows for
            deterministic nodes), or None when every node is deterministic.
        target_probs: (n + 1, V) warped target distributions at the root and after each node.
        generator: the only source of randomness.
    Returns:
        The accepted path and the (len(path) + 1,) tokens to append.
    """
    p = target_probs.double()
    drafted = tokens.tolist()
    kids = _kids(len(drafted), parents)
    path: list[int] = []
    node = -1
    while True:
        r = p[node + 1]
        step = None
        for kid in kids(node):
            x = drafted[kid]
            q = None if laws is None else laws[kid].double()
            ratio = float(r[x]) / max(1.0 if q is None else float(q[x]), _TINY)
            # `u < ratio` (not <=) so a token the residual gives probability 0 is never accepted.
            if float(torch.rand((), dtype=torch.float64, device=p.device, generator=generator)) < ratio:
                step = kid
                break
            r = _residual(r, q, x)
        if step is None:
            token = int(torch.multinomial(r, 1, generator=generator))
            break
        path.append(step)
        node = step
    emitted = [drafted[k] for k in path] + [token]
    return path, torch.tensor(emitted, dtype=torch.long, device=tokens.device)


def _residual(r: Tensor, q: Tensor | None, x: int) -> Tensor:
    """norm(max(0, r - q)) after rejecting a child drawn from q (one-hot at x when q is None)."""
    if q is None:
        residual = r.clone()
        residual[x] = 0.0
    else:
        residual = (r - q).clamp_min(0.0)
    total = residual.sum()
    # r <= q everywhere happens only up to rounding (a rejection needs r(x) < q(x), hence mass
    # elsewhere); keep r rather than divide by zero.
    return torch.where(total > 0, residual / total.clamp_min(_TINY), r)


def greedy_verify(drafts: Tensor, target_logits: Tensor) -> tuple[Tensor, int]:
    """Chain entry point of `greedy_tree`: accept the longest prefix where draft == target
    argmax, then append the target's argmax (Leviathan et al. 2023 §2; HF `_assisted_decoding`
    "Case 2").

    Args:
        drafts: (g,) long drafted tokens, g >= 0.
        target_logits: (g + 1, V) target logits after the context and after each draft.
    Returns:
        (n + 1,) long tokens to append and n, the number of accepted drafts.
    """
    _check_chain(drafts, target_logits, "target_logits")
    path, new = greedy_tree(drafts, None, target_logits)
    return new, len(path)


def _check_chain(drafts: Tensor, target: Tensor, name: str, draft_probs: Tensor | None = None) -> None:
    """The chain entry points' shapes and values (the loop calls the tree functions directly,
    so this costs it nothing): (g,) integer drafts inside the vocabulary, (g + 1, V) target rows,
    (g, V) draft rows, probabilities finite and non-negative."""
    if not isinstance(drafts, Tensor) or drafts.dim() != 1 or drafts.dtype.is_floating_point \
            or drafts.dtype == torch.bool:
        raise ValueError(f"drafts must be a (g,) integer tensor, got "
                         f"{tuple(drafts.shape) if isinstance(drafts, Tensor) else type(drafts).__name__}"
                         f"{' ' + str(drafts.dtype) if isinstance(drafts, Tensor) else ''}")
    g = drafts.shape[0]
    if not isinstance(target, Tensor) or target.dim() != 2 or target.shape[0] != g + 1:
        raise ValueError(f"{name} must be ({g + 1}, V) for {g} drafts, got "
                         f"{tuple(target.shape) if isinstance(target, Tensor) else type(target).__name__}")
    vocab = target.shape[1]
    if g and not bool(((drafts >= 0) & (drafts < vocab)).all()):
        raise ValueError(f"drafts hold ids outside the vocabulary [0, {vocab})")
    rows = [(name, target)] if name.endswith("probs") else []
    if draft_probs is not None:
        if not isinstance(draft_probs, Tensor) or tuple(draft_probs.shape) != (g, vocab):
            raise ValueError(f"draft_probs must be ({g}, {vocab}), got "
                             f"{tuple(draft_probs.shape) if isinstance(draft_probs, Tensor) else type(draft_probs).__name__}")
        rows.append(("draft_probs", draft_probs))
    for label, probs in rows:
        if not bool(torch.isfinite(probs).all()) or bool((probs < 0).any()):
            raise ValueError(f"{label} must hold finite non-negative probabilities")


def speculative_verify(drafts: Tensor, draft_probs: Tensor | None, target_probs: Tensor,
                       generator: torch.Generator | None) -> tuple[Tensor, int]:
    """Chain entry point of `sample_tree`: modified rejection sampling (Leviathan et al. 2023
    Alg. 1 / Chen et al. 2023). Accept draft i with probability min(1, p_i(x_i) / q_i(x_i)); at
    the first rejection sample from norm(max(0, p_i - q_i)) and stop; if all g pass, sample a
    bonus token from p_{g+1}. A deterministic drafter (prompt lookup, argmax dLLM unmasking)
    passes `draft_probs=None`: q is one-hot (vLLM's `draft_probs is None` path).

    Args:
        drafts: (g,) long drafted tokens.
        draft_probs: (g, V) float the distributions the drafts were sampled from (after the same
            temperature/top-k/top-p as the target), or None for a deterministic drafter.
        target_probs: (g + 1, V) float warped target distributions.
        generator: the only source of randomness.
    Returns:
        (n + 1,) long tokens to append and n, the number of accepted drafts.
    """
    _check_chain(drafts, target_probs, "target_probs", draft_probs)
    path, new = sample_tree(drafts, None, draft_probs, target_probs, generator)
    return new, len(path)
