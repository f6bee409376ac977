"""A causal guide model beside the dLLM: its next-token log-probabilities over a step's window.

A rule that names a `guide` (APD: a small autoregressive verifier) reads, for every window
column j, the guide's `log p_AR(. | canvas_<j)`, where the canvas has each masked window column
replaced by its candidate (the draft) and the prompt's left padding and positions are the
dLLM's (`cumsum(mask) - 1`). The guide must share the dLLM's tokenizer: ids the two do not share
(past the smaller vocabulary) and the dLLM's [MASK] get -inf.

The guide model is loaded once per (name, device, dtype) and is not scheduler state. `auto`
names the dLLM's own same-tokenizer partner: `ar_target` for the embedded dLLM, or what the
model declares in an `ar_partner` attribute (a name, a causal model, or a function building one).

The AR KV cache of the committed prefix: the caller may hand `logits` a per-request `memory`
dict kept across steps. Columns before the step's window are committed and never change while
the request's rows and canvas width stay the same (rows leave, a newcomer's admission shifts the
canvas, a trim cuts it: each changes one of the two), so their keys and values are kept there
and only the columns from the cached length on are fed. The cache holds at most the columns
before `offset - 1` (the window's first prediction is read from column `offset - 1`), is
extended when the window moves on, and dropped when the rows or the width change or the window
moves back.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch
from torch import Tensor

from dllm_decode.devices import device_of

_MODELS: dict[tuple[str, str, torch.dtype], Any] = {}     # named causal models, loaded once
_GUIDES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # dLLM -> {name: ARGuide}
_LOCK = threading.Lock()
AUTO = "auto"


def partner_of(model: Any) -> Any:
    """The dLLM's own same-tokenizer causal partner (name, model or builder), or None."""
    declared = getattr(model, "ar_partner", None)
    if declared is not None:
        return declared
    if str(getattr(model, "name_or_path", "")) == "embedded":
        return "ar_target"
    return None


def load_guide(name: str, dllm: Any) -> ARGuide:
    """The guide `name` (or `auto`) for `dllm`, on its device and dtype, loaded once.

    Raises:
        ValueError: no partner is known for `auto`, the guide cannot be loaded, or its
            vocabulary disagrees with the dLLM's (one line naming both).
    """
    source = partner_of(dllm) if name == AUTO else name
    if source is None:
        raise ValueError(f"no same-tokenizer causal guide is known for model "
                         f"{getattr(dllm, 'name_or_path', type(dllm).__name__)!r}; name one "
                         f"(-o verifier=NAME: ar_target, ar_draft, a directory)")
    device = device_of(dllm)
    dtype = next((p.dtype for p in dllm.parameters()), torch.float32) if hasattr(dllm, "parameters") \
        else torch.float32
    with _LOCK:
        mine = _GUIDES.setdefault(dllm, {})
        if name not in mine:
            if isinstance(source, str):
                key = (source, str(device), dtype)
                if key not in _MODELS:
                    _MODELS[key] = _build(source, device, dtype)
                mine[name] = ARGuide(_MODELS[key], dllm)
            else:
                mine[name] = ARGuide(_build(source, device, dtype), dllm)
        return mine[name]


def _build(source: Any, device: torch.device, dtype: torch.dtype) -> Any:
    if isinstance(source, str):
        from dllm_decode.models.causal import load_causal_lm
        from dllm_decode.models.checkpoint import ModelLoadError

        try:
            return load_causal_lm(source, dtype=dtype, device=device)
        except ModelLoadError as err:
            raise ValueError(f"cannot load the guide {source!r}: {err}") from None
    model = source() if callable(source) and not isinstance(source, torch.nn.Module) else source
    return model.to(device=device, dtype=dtype).eval()


class ARGuide:
    """One causal model serving as a guide for one dLLM (vocabularies checked once)."""

    def __init__(self, model: Any, dllm: Any):
        self.model = model
        self.vocab = int(getattr(model.config, "vocab_size", 0)
                         or model.get_output_embeddings().weight.shape[0])
        self.shared = min(self.vocab, int(dllm.vocab_size))
        self.mask_id = int(dllm.mask_token_id)
        name = getattr(model, "name_or_path", type(model).__name__)
        ours, theirs = getattr(dllm, "tokenizer", None), getattr(model, "tokenizer", None)
        if ours is not None and theirs is not None:
            a = {i: t for t, i in ours.get_vocab().items() if i < self.shared}
            b = {i: t for t, i in theirs.get_vocab().items() if i < self.shared}
            if a != b:
                raise ValueError(f"the guide {name!r} does not share the tokenizer of "
                                 f"{getattr(dllm, 'name_or_path', type(dllm).__name__)!r} (ids "
                                 f"0..{self.shared - 1} differ); a guide needs the same vocabulary")
        self.dllm_vocab = int(dllm.vocab_size)

    def logits(self, canvas: Tensor, attention_mask: Tensor | None, offset: int, draft: Tensor,
               memory: dict[str, Any] | None = None) -> Tensor:
        """(b, W, V_D) log-probabilities for window columns `[offset, offset + W)` (offset >= 1:
        a prompt is never empty), given the rows' (b, L) canvases and attention mask (or None)
        and the (b, W) draft: the window's tokens with each masked column replaced by its
        candidate. One forward of the guide over columns `[0, offset + W)`, less the prefix
        cached in `memory` (a dict the caller keeps per request across steps; None: no cache)."""
        from dllm_decode.speculative.kv import KV, cache_argument, new_kv, rollback

        width = draft.shape[1]
        ids = torch.cat([canvas[:, :offset], draft], 1).clamp_max(self.vocab - 1)
        mask = torch.ones_like(ids) if attention_mask is None else attention_mask[:, :offset + width]
        positions = (mask.cumsum(-1) - 1).clamp_min(0)
        kv, start, key = None, 0, (tuple(canvas.shape), str(canvas.device))
        if memory is not None:
            held = memory.get("guide")
            if held is not None and held[0] == key and held[1] <= offset - 1:
                start, kv = held[1], held[2]
            else:
                kv = new_kv(self.model)
        # causal and padding mask built here as a 4-D mask, which transformers uses as it is (its
        # 2-D mask path reads the mask on the host; this one does not sync)
        length = ids.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool, device=ids.device).tril()
        full = causal & mask.bool()[:, None, None, :]
        full = full | torch.eye(length, dtype=torch.bool, device=ids.device)   # padding sees itself
        full = full[:, :, start:]                                              # the rows fed
        extra = {} if kv is None else {cache_argument(type(self.model)): kv.cache}
        out = self.model(input_ids=ids[:, start:], attention_mask=self._mask(full),
                         position_ids=positions[:, start:], use_cache=kv is not None, **extra)
        if memory is not None:                    # keep the committed prefix, drop the rest
            memory["guide"] = (key, offset - 1, rollback(KV(kv.cache, ids[0]), offset - 1))
        rows = out.logits[:, offset - 1 - start:offset + width - 1 - start].float()
        rows = rows.log_softmax(-1)[..., :self.shared]
        pad = torch.full((*draft.shape, max(0, self.dllm_vocab - self.shared)), float("-inf"),
                         device=rows.device)
        return torch.cat([rows, pad], -1).index_fill(
            -1, torch.tensor([self.mask_id], device=rows.device), float("-inf"))

    def _mask(self, mask: Tensor) -> Tensor:
        """A (b, 1, q, k) bool mask as the guide's attention takes it: bool for SDPA, additive
        float for eager attention."""
        if getattr(getattr(self.model, "config", None), "_attn_implementation", "sdpa") != "eager":
            return mask
        dtype = next(self.model.parameters()).dtype
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
            ~mask, torch.finfo(dtype).min)
