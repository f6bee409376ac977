"""What several benchmark records check or load before their work: the model under test, model
names, cache variants. Each loads its machinery when called (the records stay light)."""

from __future__ import annotations

from typing import Any

from dllm_decode.eval.bench.protocol import Settings, blame


def subject(settings: Settings) -> Any:
    """The diffusion model under test (`model`), on `threads` torch threads, keeping its K/V as
    `kv_cache_dtype` asks (`--kv-cache-dtype`, where a benchmark takes it)."""
    import torch
    from transformers.utils import logging

    from dllm_decode.eval.bench.subject import load_subject

    torch.set_num_threads(settings.get("threads", 1))
    logging.disable_progress_bar()
    from dllm_decode.quant.kv import set_kv_cache_dtype

    with blame("--model"):
        loaded = load_subject(settings.get("model", "embedded"))
    with blame("--kv-cache-dtype"):
        set_kv_cache_dtype(loaded.model, settings.get("kv_cache_dtype", "auto"))
    return loaded


def diffusion_named(text: str, flag: str = "--model") -> None:
    """A diffusion model name that can be loaded, checked before any work."""
    from dllm_decode.eval.bench.subject import diffusion_spec

    with blame(flag):
        diffusion_spec(text)


def causal_named(text: str | None, flag: str, default: str | None = None) -> None:
    """A causal LM the user named explicitly must exist: an error before any work, not a suite
    skipped at run time (defaults keep skipping when not installed)."""
    if text is None or text == default:
        return
    from pathlib import Path

    from dllm_decode.models.gguf import WHEEL_MODELS
    from dllm_decode.models.causal import resolve_causal_dir

    with blame(flag):
        if text in WHEEL_MODELS:
            return
        if text.endswith(".gguf"):
            if not Path(text).expanduser().is_file():
                raise ValueError(f"GGUF file {text!r} does not exist")
            return
        resolve_causal_dir(text)


def cache_variants(texts: tuple[str, ...], flag: str) -> tuple[tuple[str, Any], ...]:
    """`NAME[:KEY=VALUE,...]` texts -> (text, cache) pairs."""
    from dllm_decode.modelspec import parse_options
    from dllm_decode.registry import component

    with blame(flag):
        pairs = [(text, *text.partition(":")[::2]) for text in texts]
        return tuple((text, component("cache", {"name": name.strip(), **dict(parse_options(rest))}))
                     for text, name, rest in pairs)
