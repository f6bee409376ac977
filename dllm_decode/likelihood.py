"""Log-likelihood of a continuation under a masked diffusion LM: LLaDA's Monte-Carlo ELBO.

A masked diffusion LM has no left-to-right factorisation, so `log p(target | prefix)` is estimated
by its evidence lower bound (LLaDA, arXiv 2502.09992, Eq. 6 conditioned on the prompt; the
estimator of LLaDA's `eval_llada.py` `get_log_likelihood`):

    -log p(y | x) <= E_{m ~ U{1..L}} E_{mask m of the L target tokens} [ (L / m) * sum_{masked i} CE_i ]

Each of `mc_num / mc_batch` forwards scores `mc_batch` noisy copies whose mask counts are spread
evenly over 1..L from one random start (stratified: lower variance than independent draws); the
prefix is never masked. With classifier-free guidance (`cfg > 0`) the logits are
`u + (cfg + 1) (c - u)`, `u` from the copy with the prefix masked too (LLaDA's unsupervised
branch). A single-token target has one mask pattern, scored exactly by one forward.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from dllm_decode.devices import device_of
from dllm_decode.prompts import encode_prompts


@torch.inference_mode()
def loglikelihood(model: Any, prefix: Sequence[int], target: Sequence[int], *, mc_num: int = 128,
                  mc_batch: int = 32, cfg: float = 0.0, seed: int = 0) -> float:
    """ELBO estimate of `log p(target | prefix)` (nats; see the module docstring).

    Args:
        model: a DiffusionLM (`mask_token_id`, `forward(input_ids, rows=...)`).
        prefix: conditioning token ids (may be empty); never masked.
        target: the continuation's token ids (non-empty).
        mc_num: noisy copies scored; a multiple of `mc_batch` (LLaDA's default 128).
        mc_batch: copies per forward.
        cfg: classifier-free guidance scale (0: off).
        seed: with the token ids, seeds the mask draws, so a score does not depend on the order
            or company in which requests are scored.
    Raises:
        ValueError: an empty target, `mc_num` not a positive multiple of `mc_batch`, a negative
            `cfg`, or a sequence longer than the model's context.
    """
    if not len(target):
        raise ValueError("the target (continuation) is empty")
    (ids,) = encode_prompts([[*prefix, *target]], None, getattr(model, "vocab_size", None))  # ints only
    prefix, target = ids[:len(ids) - len(target)], ids[len(ids) - len(target):]
    if mc_batch < 1 or mc_num < mc_batch or mc_num % mc_batch:
        raise ValueError(f"mc_num ({mc_num}) must be a positive multiple of mc_batch ({mc_batch})")
    if not cfg >= 0:
        raise ValueError(f"cfg must be >= 0, got {cfg}")
    limit = getattr(model, "max_length", None)
    if limit is not None and len(prefix) + len(target) > limit:
        raise ValueError(f"prefix ({len(prefix)}) + target ({len(target)}) tokens exceed the model's "
                         f"context of {limit}")
    device = device_of(model)
    sequence = torch.tensor(prefix + target, device=device)
    length, start = len(target), len(prefix)
    generator = torch.Generator(device=device).manual_seed(_seed(seed, prefix, target))
    if length == 1:                                   # one mask pattern: exact, one forward
        mc_num = mc_batch = 1
    total = torch.zeros((), dtype=torch.float64, device=device)
    for _ in range(mc_num // mc_batch):
        counts = _mask_counts(length, mc_batch, generator, device)                 # (b,) in 1..L
        ranks = torch.rand(mc_batch, length, generator=generator, device=device).argsort(-1).argsort(-1)
        masked = ranks < counts.unsqueeze(-1)                                      # (b, L) m_b random positions
        noisy = sequence.repeat(mc_batch, 1)
        noisy[:, start:] = torch.where(masked, model.mask_token_id, noisy[:, start:])
        logits = _guided_logits(model, noisy, start, cfg)                          # (b, L, V)
        loss = F.cross_entropy(logits[masked].float(), sequence[start:].expand(mc_batch, -1)[masked],
                               reduction="none")
        weight = (length / counts.double()).unsqueeze(-1).expand(-1, length)[masked]
        total += (loss.double() * weight).sum() / mc_batch
    return -float(total / (mc_num // mc_batch))


def _mask_counts(length: int, batch: int, generator: torch.Generator, device: Any) -> Tensor:
    """`batch` mask counts in 1..length, evenly spaced from a uniform random start (LLaDA's
    stratified draw: `((round(linspace(k, k + (b-1) L / b, b)) - 1) mod L) + 1`)."""
    k = torch.randint(1, length + 1, (), generator=generator, device=device)
    spread = torch.linspace(0, (batch - 1) * length / batch, batch, device=device)
    return ((torch.round(k + spread).long() - 1) % length) + 1


def _guided_logits(model: Any, noisy: Tensor, start: int, cfg: float) -> Tensor:
    width = noisy.shape[1]
    if cfg == 0:
        return model(noisy, rows=(start, width))
    unconditional = noisy.clone()
    unconditional[:, :start] = model.mask_token_id
    both = model(torch.cat([noisy, unconditional]), rows=(start, width))
    conditional, free = both.chunk(2)
    return free + (cfg + 1) * (conditional - free)


def _seed(seed: int, prefix: list[int], target: list[int]) -> int:
    digest = hashlib.sha256(repr((seed, prefix, target)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1

