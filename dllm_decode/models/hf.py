"""Any transformers masked LM (BERT, RoBERTa, ModernBERT, ...) as a `DiffusionLM`.

A masked LM trained with a single masking rate is not a diffusion model, but it is a denoiser of
the same shape (canvas in, logits for every position out), which makes it a cheap stand-in for
tests and for comparing unmasking policies. There is no KV cache (`supports_kv = False`).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from dllm_decode.models.layers import default_positions
from dllm_decode.models.checkpoint import ModelLoadError, custom_code, require_bool, untrusted_code_error


def _position_offset(model: nn.Module) -> int:
    """First position id of a sequence: RoBERTa-style embeddings start after `padding_idx`."""
    embeddings = getattr(model.base_model, "embeddings", None)
    table = getattr(embeddings, "position_embeddings", None)
    if isinstance(table, nn.Embedding) and table.padding_idx is not None:
        return table.padding_idx + 1
    return 0


class HFMaskedLM(nn.Module):
    """Wraps a `transformers` `*ForMaskedLM` model; row i of the logits predicts the token at i.

    Positions: when the wrapped forward takes `position_ids`, a padded batch gets
    `cumsum(attention_mask) - 1` (plus the family's offset), so a left-padded row sees the
    positions of the unpadded one; otherwise the model's own positions apply. `max_length` is
    `max_position_embeddings` minus that offset (RoBERTa: 514 -> 512).

    Args:
        model: the masked LM, e.g. `BertForMaskedLM`.
        mask_token_id: id of the mask token (from the tokenizer).
        eos_token_ids: ids that end a generation (the tokenizer's sep/eos).
    """

    supports_kv = False
    trimmable = True           # attention-masked columns never reach the kept ones

    def __init__(self, model: nn.Module, mask_token_id: int, eos_token_ids: tuple[int, ...] = ()):
        super().__init__()
        self.model = model
        self.mask_token_id = mask_token_id
        self.eos_token_ids = tuple(eos_token_ids)
        head = model.get_output_embeddings()                   # logit columns may exceed the vocab
        self.vocab_size: int = head.weight.shape[0] if head is not None else model.config.vocab_size
        self._offset = _position_offset(model)
        self._takes_positions = "position_ids" in inspect.signature(model.forward).parameters
        max_positions = getattr(model.config, "max_position_embeddings", None)
        self.max_length: int | None = None if max_positions is None else max_positions - self._offset

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                positions: Tensor | None = None, kv: Any = None,
                rows: tuple[int, int] | None = None) -> Tensor:
        """Logits (B, b - a, V) for canvas rows `rows = (a, b)` (default all); see `DiffusionLM`."""
        if kv is not None:
            raise ValueError(f"{type(self.model).__name__} has no KV cache (supports_kv is False); "
                             f"use the 'none' cache")
        if positions is not None and not self._takes_positions:
            raise ValueError(f"{type(self.model).__name__} does not accept positions")
        batch, length = input_ids.shape
        kwargs: dict[str, Tensor] = {}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask
        if self._takes_positions and (positions is not None or attention_mask is not None):
            if positions is None:
                positions = default_positions(attention_mask, batch, length, input_ids.device)
            kwargs["position_ids"] = positions + self._offset
        a, b = rows if rows is not None else (0, length)
        return self.model(input_ids=input_ids, **kwargs).logits[:, a:b].float()


def load_masked_lm(directory: Path, tokenizer: Any, trust_remote_code: bool = False) -> HFMaskedLM:
    """Load `directory` with `AutoModelForMaskedLM` (offline) and wrap it.

    Args:
        trust_remote_code: allow a model class defined by a Python file in the directory.
    Raises:
        ModelLoadError: no tokenizer or no mask token, weights missing or of the wrong shape,
            custom code without `trust_remote_code`, or anything transformers cannot load.
        TypeError: `trust_remote_code` that is not a bool.
    """
    require_bool(trust_remote_code, "trust_remote_code")
    if tokenizer is None:
        raise ModelLoadError(f"{directory} has no tokenizer; a generic masked LM takes its mask "
                             f"token from it")
    if tokenizer.mask_token_id is None:
        raise ModelLoadError(f"the tokenizer in {directory} has no mask token; diffusion decoding "
                             f"needs one")
    reference = custom_code(directory, "config.json", "AutoModelForMaskedLM")
    if reference and not trust_remote_code:
        raise untrusted_code_error(directory, "model", reference)
    from transformers import AutoModelForMaskedLM

    try:
        model, info = AutoModelForMaskedLM.from_pretrained(
            str(directory), local_files_only=True, trust_remote_code=trust_remote_code,
            output_loading_info=True)
    except Exception as err:  # noqa: BLE001 - transformers raises many types for bad directories
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelLoadError(f"cannot load {directory} as a transformers masked LM: "
                             f"{first_line}") from None
    # Extra keys are normal (pre-training heads); missing ones would be silently random.
    if info["missing_keys"] or info["mismatched_keys"]:
        raise ModelLoadError(f"{directory}: weights do not match the config (missing "
                             f"{sorted(info['missing_keys'])[:3]}, wrong shape "
                             f"{sorted(map(str, info['mismatched_keys']))[:3]})")
    eos = (tokenizer.sep_token_id, tokenizer.eos_token_id)
    return HFMaskedLM(model, tokenizer.mask_token_id,
                      tuple(dict.fromkeys(i for i in eos if i is not None)))
