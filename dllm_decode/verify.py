"""`verify`: does this package's port of a checkpoint compute what the checkpoint's reference
implementation computes, on the user's own checkpoint and device?

The reference is the implementation the checkpoint names: transformers' own class where
transformers has one (DiffusionGemma: `DiffusionGemmaForBlockDiffusion`; a generic masked LM such
as BERT or ModernBERT: its `AutoModelForMaskedLM` class), else the checkpoint's own modeling files
(`auto_map` in config.json: LLaDA, Dream, Fast-dLLM v2, SDAR, LLaDA2), loaded only with
`trust_remote_code=True`. Both run in float32 on a few seeded prompts: the largest logit
difference is checked against the project's tolerance (`dllm_decode.testing.FLOAT32_ULPS`
float32 ulps of the logits' scale); where the reference ships a `generate` (DiffusionGemma) the
seeded default decode must agree token for token, else the greedy (argmax) predictions at the
masked positions must.

A reference from the checkpoint's own code is called as `model(input_ids).logits` on a prompt
plus a [MASK] tail: its forward applies the family's own attention (bidirectional, or
block-causal on the block grid for Fast-dLLM v2, SDAR and LLaDA2) and, for Dream and Fast-dLLM
v2, returns the shifted logits (row i predicts i + 1), which are aligned here.
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
MASK_TAIL = 8
REMOTE_FAMILIES = ("llada", "dream", "fast_dllm_qwen", "fast_dllm_llama", "sdar", "llada2_moe", "llada21_moe")
"""Families (config.json `model_type`) whose reference is the checkpoint's own code (`auto_map`)."""
SHIFTED = ("dream", "fast_dllm_qwen", "fast_dllm_llama")
"""Families whose network's row i predicts position i + 1: the reference's raw logits are aligned
by this, the family's convention, never by the port's own `token_shift` (a port that forgot the
shift must fail)."""
AUTO_CLASSES = ("AutoModel", "AutoModelForCausalLM", "AutoModelForMaskedLM")
"""The `auto_map` entries a remote reference is loaded through, in this order."""


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

    from dllm_decode.models.loading import BUILDERS, _model_kind

    directory = resolve_model_dir(path)
    config = read_config(directory)
    model_type = str(config.get("model_type", "")).lower()
    if model_type == "diffusion_gemma":
        return verify_diffusion_gemma(directory, str(path), device, seed)
    if model_type in REMOTE_FAMILIES:
        auto = [name for name in AUTO_CLASSES if name in (config.get("auto_map") or {})]
        if not auto:
            raise VerifyError(f"the reference for model_type {model_type!r} is the checkpoint's own modeling "
                              f"code, and its config.json names none (no auto_map {list(AUTO_CLASSES)} entry)")
        if not trust_remote_code:
            raise VerifyError(f"the reference for model_type {model_type!r} is the checkpoint's own "
                              f"code (config.json auto_map); pass --trust-remote-code to run it")
        return verify_canvas(directory, str(path), model_type, device, seed, auto[0])
    if model_type not in BUILDERS and _model_kind(config) == "masked":
        return verify_canvas(directory, str(path), model_type, device, seed, None)
    raise VerifyError(f"verify has no reference for model_type {model_type!r}; it covers "
                      f"['diffusion_gemma'] and transformers' masked LMs (transformers' own classes) and "
                      f"{list(REMOTE_FAMILIES)} (their own code)")


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


def verify_canvas(directory: Path, name: str, model_type: str, device: str | None, seed: int,
                  auto_class: str | None) -> Report:
    """Full-canvas logits (prompt plus a [MASK] tail) and the greedy predictions at the masked
    positions, against the checkpoint's own model class (`auto_class`, an `auto_map` entry, with
    `trust_remote_code`) or, for a transformers masked LM (`auto_class` None), its own class."""
    import transformers

    from dllm_decode.models.loading import load_model

    dev = torch.device(device or "cpu")
    remote = auto_class is not None
    loader = getattr(transformers, auto_class or "AutoModelForMaskedLM")
    with quiet_transformers():
        ours = load_model(directory, dtype=torch.float32, device=dev, trust_remote_code=remote)
        config = transformers.AutoConfig.from_pretrained(str(directory), trust_remote_code=remote)
        ref = loader.from_pretrained(str(directory), config=config, trust_remote_code=remote,
                                     dtype=torch.float32).to(dev).eval()
    report = Report(name, model_type or "masked_lm", type(ref).__module__ + "." + type(ref).__name__)
    shift = int(model_type in SHIFTED)
    mine, theirs, agree, total = [], [], 0, 0
    with torch.no_grad():
        for ids in _prompts(ours.vocab_size, seed, ours.mask_token_id):
            canvas = torch.cat([ids, torch.full((1, MASK_TAIL), ours.mask_token_id)], 1).to(dev)
            expected = ref(canvas).logits.float()
            expected = expected[:, :expected.shape[1] - shift]
            got = ours(canvas)[:, shift:]
            theirs.append(expected)
            mine.append(got)
            masked = slice(ids.shape[1] - shift, None)                 # the [MASK] tail's rows
            agree += int((got[:, masked].argmax(-1) == expected[:, masked].argmax(-1)).sum())
            total += MASK_TAIL
    report.checks.append(logits_check("logits", mine, theirs))
    report.checks.append(Check("greedy predictions", agree == total, float(total - agree), 0.0,
                               f"{agree}/{total} masked positions agree on the argmax over {len(mine)} prompts"))
    return report
