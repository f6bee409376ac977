"""`verify`: does this package's port of a checkpoint compute what the checkpoint's reference
implementation computes, on the user's own checkpoint and device?

The reference is the implementation the checkpoint names: transformers' own class where
transformers has one (DiffusionGemma: `DiffusionGemmaForBlockDiffusion`), else the checkpoint's
own modeling files (`auto_map` in config.json), loaded only with `trust_remote_code=True`
(LLaDA, Dream). Both run in float32 on a few seeded prompts: the largest logit difference is
checked against the project's tolerance (`dllm_decode.testing.FLOAT32_ULPS` float32 ulps of the
logits' scale), and, where the reference ships a `generate`, the seeded default decode must
agree token for token.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from dllm_decode.testing import FLOAT32_ULPS

PROMPT_LENGTHS = (5, 11, 17)
REMOTE_FAMILIES = ("llada", "dream")
"""Families whose reference is the checkpoint's own code (`auto_map`): logits are compared."""


class VerifyError(ValueError):
    """The checkpoint cannot be verified (no reference, no opt-in): a usage problem, not a failure."""


@dataclass(frozen=True)
class Check:
    """One comparison: `value` against `tolerance` (logits), or agreeing tokens (decode)."""

    name: str
    ok: bool
    value: float
    tolerance: float
    detail: str = ""


@dataclass
class Report:
    model: str
    family: str
    reference: str
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "family": self.family, "reference": self.reference,
                "ok": self.ok, "checks": [asdict(c) for c in self.checks]}


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """No progress bar or info lines from transformers while the reference loads."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def tolerance_of(expected: torch.Tensor) -> float:
    scale = max(float(expected.abs().amax()), 1.0)
    return FLOAT32_ULPS * float(torch.finfo(torch.float32).eps) * scale


def logits_check(name: str, ours: list[torch.Tensor], theirs: list[torch.Tensor]) -> Check:
    diff = max(float((a.float() - b.float()).abs().amax()) for a, b in zip(ours, theirs))
    tol = min(tolerance_of(b) for b in theirs)
    return Check(name, diff <= tol, diff, tol, f"{len(ours)} comparisons")


def verify(path: str | Path, trust_remote_code: bool = False, device: str | None = None,
           seed: int = 0) -> Report:
    """Compare the port of the checkpoint at `path` with its reference implementation.

    Raises:
        VerifyError: no reference for this family, or one that needs `trust_remote_code`.
        ModelLoadError: the checkpoint does not load.
    """
    from dllm_decode.models.checkpoint import read_config, resolve_model_dir

    directory = resolve_model_dir(path)
    model_type = str(read_config(directory).get("model_type", "")).lower()
    if model_type == "diffusion_gemma":
        return verify_diffusion_gemma(directory, str(path), device, seed)
    if model_type in REMOTE_FAMILIES:
        if not trust_remote_code:
            raise VerifyError(f"the reference for model_type {model_type!r} is the checkpoint's own "
                              f"code (config.json auto_map); pass --trust-remote-code to run it")
        return verify_remote(directory, str(path), model_type, device, seed)
    raise VerifyError(f"verify has no reference for model_type {model_type!r}; it covers "
                      f"['diffusion_gemma'] (transformers) and {list(REMOTE_FAMILIES)} (their own code)")


def _prompts(vocab: int, seed: int, banned: int | None = None) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    out = []
    for n in PROMPT_LENGTHS:
        ids = torch.randint(3, vocab, (1, n), generator=generator)
        if banned is not None:
            ids = ids.masked_fill(ids == banned, 3)
        out.append(ids)
    return out


def verify_diffusion_gemma(directory: Path, name: str, device: str | None, seed: int) -> Report:
    """Encoder + decoder logits (fresh and filled cache, with and without self-conditioning)
    and the seeded default decode, against transformers' `DiffusionGemmaForBlockDiffusion`."""
    from transformers import DiffusionGemmaForBlockDiffusion
    from transformers.cache_utils import DynamicCache

    from dllm_decode.config import DecodeConfig
    from dllm_decode.models.loading import load_model
    from dllm_decode.sampler import generate

    dev = torch.device(device or "cpu")
    ours = load_model(directory, dtype=torch.float32, device=dev)
    with quiet_transformers():
        ref = DiffusionGemmaForBlockDiffusion.from_pretrained(str(directory), dtype=torch.float32).to(dev).eval()
    report = Report(name, "diffusion_gemma", "transformers.DiffusionGemmaForBlockDiffusion")
    size, vocab = ours.canvas_length, ours.vocab_size
    prompts = [p.to(dev) for p in _prompts(vocab, seed, ours.config.image_token_id)]
    generator = torch.Generator().manual_seed(seed + 1)
    mine, theirs = [], []
    with torch.no_grad():
        for ids in prompts:
            canvases = [torch.randint(0, vocab, (1, size), generator=generator).to(dev) for _ in range(2)]
            cache, ref_cache = ours.encode(ids), DynamicCache(config=ref.config.text_config)
            ref.model.encoder(input_ids=ids, cache=ref_cache,
                              position_ids=torch.arange(ids.shape[1], device=dev)[None])
            for i, canvas in enumerate(canvases):
                if i:
                    start = ref_cache.get_seq_length()
                    ref.model.encoder(input_ids=canvases[i - 1], cache=ref_cache,
                                      position_ids=torch.arange(start, start + size, device=dev)[None])
                    cache = ours.encode(canvases[i - 1], None, cache)
                first = ref(decoder_input_ids=canvas, cache=ref_cache).logits
                second = ref(decoder_input_ids=canvas, cache=ref_cache, self_conditioning_logits=first).logits
                theirs += [first, second]
                mine += [ours.denoise(canvas, cache), ours.denoise(canvas, cache, first)]
    report.checks.append(logits_check("logits", mine, theirs))
    config = DecodeConfig.for_model(ours, gen_length=2 * size)
    shipped = ours.generation_defaults
    kwargs = {"max_new_tokens": 2 * size, "max_denoising_steps": config.scheduler.steps}
    kwargs.update({k: shipped[k] for k in ("eos_token_id", "pad_token_id") if k in shipped})
    agree, total = 0, 0
    for i, ids in enumerate(prompts):
        torch.manual_seed(seed + i)
        expected = ref.generate(ids, **kwargs).sequences[:, ids.shape[1]:].cpu()
        got = generate(ours, [ids[0].tolist()], config,
                       generator=torch.Generator(device=dev).manual_seed(seed + i)).tokens
        agree += int((got[:, :expected.shape[1]] == expected).sum())
        total += expected.numel()
    report.checks.append(Check("seeded decode", agree == total, float(total - agree), 0.0,
                               f"{agree}/{total} tokens agree over {len(prompts)} prompts"))
    return report


def verify_remote(directory: Path, name: str, model_type: str, device: str | None, seed: int) -> Report:
    """Full-canvas logits (prompt plus [MASK] tail) against the checkpoint's own model class."""
    from transformers import AutoConfig, AutoModel

    from dllm_decode.models.loading import load_model

    dev = torch.device(device or "cpu")
    ours = load_model(directory, dtype=torch.float32, device=dev, trust_remote_code=True)
    with quiet_transformers():
        config = AutoConfig.from_pretrained(str(directory), trust_remote_code=True)
        ref = AutoModel.from_pretrained(str(directory), config=config, trust_remote_code=True,
                                        dtype=torch.float32).to(dev).eval()
    report = Report(name, model_type, type(ref).__module__ + "." + type(ref).__name__)
    shift = 1 if model_type == "dream" else 0       # Dream's row i predicts i + 1
    mine, theirs = [], []
    with torch.no_grad():
        for ids in _prompts(ours.vocab_size, seed):
            canvas = torch.cat([ids, torch.full((1, 8), ours.mask_token_id)], 1).to(dev)
            expected = ref(canvas).logits.float()
            got = ours(canvas)
            theirs.append(expected[:, :expected.shape[1] - shift])
            mine.append(got[:, shift:])
    report.checks.append(logits_check("logits", mine, theirs))
    return report
