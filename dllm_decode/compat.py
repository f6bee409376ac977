"""Which parts work together, found by trying them, never written down by hand.

`accepted_caches(model)` lists the registered caches that accept a model (each cache's own
`init_state` check decides); the CLI and the caches' own errors name that list. `matrix()`
decodes a few tokens with every scheduler x cache, every scheduler x model family and every
cache x model family on seeded tiny models of each family, and records what ran and, for what
did not, the one-line reason the toolkit gives. The documentation's compatibility page is
generated from it at build time, so it cannot drift from the code.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_probing = threading.local()


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def cache_refusal(cache: Any, model: Any) -> str | None:
    """Why `cache` refuses `model` (its `init_state` message), or None when it accepts it."""
    try:
        cache.init_state(model)
    except (ValueError, TypeError) as err:
        return first_line(err)
    return None


def accepted_caches(model: Any) -> list[str]:
    """The registry names of the caches (default settings) whose `init_state` accepts `model`.

    Safe to call from inside a cache's `init_state` (while it is probing, a nested call answers
    an empty list instead of recursing)."""
    from dllm_decode.registry import registry

    if getattr(_probing, "active", False):
        return []
    _probing.active = True
    try:
        return [name for name, cls in registry("cache").items() if cache_refusal(cls(), model) is None]
    finally:
        _probing.active = False


def accepted_hint(model: Any) -> str:
    """`accepted caches for this model: a, b, c` (empty while probing), for error messages."""
    names = accepted_caches(model)
    return f"; accepted caches for this model: {', '.join(names)}" if names else ""


# --- the compatibility matrix ----------------------------------------------------------------


def _tiny_dream() -> Any:
    import torch

    from dllm_decode.models.dream import DreamConfig, DreamModel

    torch.manual_seed(0)
    config = DreamConfig(vocab_size=37, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         mask_token_id=36, eos_token_id=35, pad_token_id=35)
    return DreamModel(config).eval()


def _tiny_masked_lm() -> Any:
    import torch
    from transformers import BertConfig, BertForMaskedLM

    from dllm_decode.models.hf import HFMaskedLM

    torch.manual_seed(0)
    config = BertConfig(vocab_size=37, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=37, max_position_embeddings=64)
    return HFMaskedLM(BertForMaskedLM(config), mask_token_id=4, eos_token_ids=(3,)).eval()


def _tiny_block(family: str) -> Callable[[], Any]:
    def build() -> Any:
        from dllm_decode.testing import tiny_block_diffusion

        return tiny_block_diffusion(family).eval()
    return build


def _tiny_llada() -> Any:
    from dllm_decode.testing import tiny_llada

    return tiny_llada().eval()


def _tiny_gemma() -> Any:
    from dllm_decode.testing import tiny_diffusion_gemma

    return tiny_diffusion_gemma(steps=2)


FAMILIES: dict[str, tuple[str, Callable[[], Any]]] = {
    "llada": ("LLaDA layout (LLaDA-8B, the embedded models)", _tiny_llada),
    "dream": ("Dream", _tiny_dream),
    "masked_lm": ("any transformers *ForMaskedLM (generic adapter)", _tiny_masked_lm),
    "fast_dllm": ("Fast-dLLM v2 (block diffusion)", _tiny_block("fast_dllm")),
    "sdar": ("SDAR (block diffusion)", _tiny_block("sdar")),
    "llada2": ("LLaDA2.0 / 2.1 MoE (block diffusion)", _tiny_block("llada2")),
    "diffusion_gemma": ("DiffusionGemma (uniform noise, one canvas per block)", _tiny_gemma),
}
"""Model family -> (what it covers, a seeded tiny model of that family)."""


@dataclass(frozen=True)
class Cell:
    """One combination: `ok` when a short decode ran; otherwise the toolkit's one-line reason."""

    ok: bool
    reason: str = ""


def try_decode(model: Any, scheduler: Any, cache: Any, gen_length: int = 8,
               block_length: int = 4, self_decoder: Any = None) -> Cell:
    """Decode `gen_length` tokens after a 4-token prompt (with the denoising loop, or with
    `self_decoder` after its own check, as the CLI runs it); any `ValueError`/`TypeError` (the
    toolkit's way of refusing a combination) becomes the cell's reason."""
    import torch

    from dllm_decode.config import DecodeConfig
    from dllm_decode.sampler import generate

    vocab = int(model.vocab_size)
    prompt = [5 % vocab, 6 % vocab, 7 % vocab, 8 % vocab]
    try:
        block = getattr(model, "block_size", None) or getattr(model, "canvas_length", None) or block_length
        config = DecodeConfig(scheduler=scheduler, cache=cache, gen_length=gen_length,
                              block_length=min(block, gen_length))
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")          # a rule's advice for a tiny random model
            generator = torch.Generator().manual_seed(0)
            if self_decoder is None:
                generate(model, [prompt], config, generator=generator)
            else:
                self_decoder.check(model, config)
                self_decoder.decode(model, [prompt], config, generator=generator)
    except (ValueError, TypeError) as err:
        return Cell(False, first_line(err))
    return Cell(True)


def try_attention(model: Any, attention: str, scheduler: Any, cache: Any) -> Cell:
    """`try_decode` on a copy of `model` given the attention back end `attention`; a back end
    that refuses the model gives its one-line reason."""
    import copy

    from dllm_decode.models.attention import set_attention

    model = copy.deepcopy(model)
    try:
        set_attention(model, attention)
    except (ValueError, TypeError) as err:
        return Cell(False, first_line(err))
    return try_decode(model, scheduler, cache)


def matrix() -> dict[str, dict[tuple[str, str], Cell]]:
    """Every scheduler x cache (LLaDA layout), scheduler x family (no cache), cache x family
    (the `threshold` scheduler), attention back end x family (no cache) and x cache (LLaDA
    layout), self-decoder x family (`threshold`, no cache) and self-decoder x cache (on the
    Fast-dLLM v2 block model, which every self-decoder accepts), each cell from a real tiny
    decode with default settings."""
    from dllm_decode.registry import registry

    schedulers, caches, attentions = registry("scheduler"), registry("cache"), registry("attention")
    models = {name: build() for name, (_, build) in FAMILIES.items()}
    llada = models["llada"]
    default = schedulers["threshold"]
    return {
        "scheduler x cache": {(s, c): try_decode(llada, schedulers[s](), caches[c]())
                              for s in schedulers for c in caches},
        "scheduler x family": {(s, f): try_decode(models[f], schedulers[s](), caches["none"]())
                               for s in schedulers for f in models},
        "cache x family": {(c, f): try_decode(models[f], default(), caches[c]())
                           for c in caches for f in models},
        "attention x family": {(a, f): try_attention(models[f], a, default(), caches["none"]())
                               for a in attentions for f in models},
        "attention x cache": {(a, c): try_attention(llada, a, default(), caches[c]())
                              for a in attentions for c in caches},
        **self_decoder_tables(models),
    }


def self_decoder_tables(models: dict[str, Any]) -> dict[str, dict[tuple[str, str], Cell]]:
    """Self-decoder x family (`threshold` base rule, no cache) over `models` (family -> tiny
    model) and self-decoder x cache on its Fast-dLLM v2 model, each cell a real tiny decode
    after the decoder's own check (as the CLI runs it)."""
    from dllm_decode.registry import registry

    caches, selfdecs = registry("cache"), registry("self_decoder")
    default = registry("scheduler")["threshold"]
    return {
        "self-decoder x family": {(d, f): try_decode(models[f], default(), caches["none"](), self_decoder=selfdecs[d]())
                                  for d in selfdecs for f in models},
        "self-decoder x cache": {(d, c): try_decode(models["fast_dllm"], default(), caches[c](),
                                                    self_decoder=selfdecs[d]())
                                 for d in selfdecs for c in caches},
    }


def markdown(cells: dict[tuple[str, str], Cell], columns: list[str] | None = None) -> str:
    """A table: rows are the first key, columns the second; `yes`, or `no` with a footnote
    number whose text (the reason) follows the table."""
    rows = list(dict.fromkeys(r for r, _ in cells))
    columns = columns or list(dict.fromkeys(c for _, c in cells))
    reasons: list[str] = []
    lines = ["| | " + " | ".join(f"`{c}`" for c in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for row in rows:
        marks = []
        for column in columns:
            cell = cells[(row, column)]
            if cell.ok:
                marks.append("yes")
            else:
                if cell.reason not in reasons:
                    reasons.append(cell.reason)
                marks.append(f"no ({reasons.index(cell.reason) + 1})")
        lines.append(f"| `{row}` | " + " | ".join(marks) + " |")
    notes = [f"{i}. {reason.replace('|', '/')}" for i, reason in enumerate(reasons, 1)]
    return "\n".join(lines) + ("\n\n" + "\n".join(notes) if notes else "") + "\n"
