"""`load_model`: a local checkpoint directory (or the local HF cache, offline) -> a DiffusionLM.

The implementation is chosen from `config.json`'s `model_type`; nothing is downloaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from dllm_decode.models.checkpoint import (ModelLoadError, check_memory, first_line,
                                           load_state_strict, load_tokenizer, read_config,
                                           read_safetensors, require_bool, resolve_model_dir,
                                           tensor_names)


def _build_native(directory: Path, config: dict[str, Any], config_cls: type, model_cls: type,
                  required: tuple[str, ...], drop: tuple[str, ...] = ()) -> nn.Module:
    """Check the config's size keys, build on the meta device (no random init of billions of
    weights), then take the checkpoint's tensors, minus the `drop` names."""
    if absent := [key for key in required if key not in config]:
        raise ModelLoadError(f"{directory / 'config.json'} lacks required key(s) {absent}")
    sharding = _SHARDING.get()
    check_memory(directory / "config.json", config,      # the smallest dtype read, split by TP
                 bytes_per_parameter=2 / (sharding[0].tp if sharding else 1))
    try:
        parsed = config_cls.from_dict(config)
    except (ValueError, TypeError) as err:
        raise ModelLoadError(f"{directory / 'config.json'}: {first_line(err)}") from None
    with torch.device("meta"):
        model = model_cls(parsed)
    quantized, spec = _QUANTIZED.get(), _QUANTIZE.get()
    if spec is not None:                   # quantize on load: refuse a bad group size now
        _quant_problem(directory, lambda: _check_group_size(model, spec))
    if sharding is not None:               # tensor parallel: this rank's slices only
        from dllm_decode.parallel.loading import load_sharded

        return load_sharded(model, directory, sharding[0], sharding[1], drop)
    state = read_safetensors(directory)
    for name in drop:
        state.pop(name, None)
    if quantized is not None:              # a quantized checkpoint: codes into QuantLinear shells
        from dllm_decode.quant import prepare_quantized

        state, layers = _quant_problem(directory, lambda: quantized.convert(state))
        _quant_problem(directory, lambda: prepare_quantized(model, quantized.spec, layers))
    load_state_strict(model, state, directory, assign=True)
    return model


def _check_group_size(model: nn.Module, spec: Any) -> None:
    from dllm_decode.quant import check_group_size

    check_group_size(model, spec)


def _quant_problem(directory: Path, work: Callable[[], Any]) -> Any:
    """`work()`, its `QuantError` as a one-line `ModelLoadError` naming the directory."""
    from dllm_decode.quant import QuantError

    try:
        return work()
    except QuantError as err:
        message = first_line(err)
        raise ModelLoadError(message if str(directory) in message else f"{directory}: {message}") \
            from None


def _build_llada(directory: Path, config: dict[str, Any]) -> nn.Module:
    from dllm_decode.models.llada import LLaDAConfig, LLaDAModelLM

    return _build_native(directory, config, LLaDAConfig, LLaDAModelLM,
                         ("d_model", "n_heads", "n_layers", "mlp_hidden_size", "vocab_size"))


def _build_dream(directory: Path, config: dict[str, Any]) -> nn.Module:
    from dllm_decode.models.dream import DreamConfig, DreamModel

    # A tied checkpoint may still carry a copy of the head; the model reads the embedding.
    drop = ("lm_head.weight",) if config.get("tie_word_embeddings") else ()
    return _build_native(directory, config, DreamConfig, DreamModel,
                         ("hidden_size", "num_hidden_layers", "num_attention_heads",
                          "intermediate_size", "vocab_size"), drop)


QWEN_SIZE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                  "vocab_size")


def _build_fast_dllm(directory: Path, config: dict[str, Any]) -> nn.Module:
    from dllm_decode.models.fast_dllm import FastDLLMConfig, FastDLLMLlamaConfig, FastDLLMModel

    llama = str(config.get("model_type")).lower() == "fast_dllm_llama"
    drop = ("lm_head.weight",) if config.get("tie_word_embeddings") else ()
    return _build_native(directory, config, FastDLLMLlamaConfig if llama else FastDLLMConfig,
                         FastDLLMModel, (*QWEN_SIZE_KEYS, "bd_size"), drop)


def _build_sdar(directory: Path, config: dict[str, Any]) -> nn.Module:
    from dllm_decode.models.sdar import SDARConfig, SDARModel

    drop = ("lm_head.weight",) if config.get("tie_word_embeddings") else ()
    return _build_native(directory, config, SDARConfig, SDARModel,
                         (*QWEN_SIZE_KEYS, "block_size"), drop)


def _build_sdar_moe(directory: Path, config: dict[str, Any]) -> nn.Module:
    raise ModelLoadError(f"{directory}: model_type 'sdar_moe' (SDAR-30B-A3B) is not implemented; "
                         f"the dense SDAR checkpoints (model_type 'sdar') are")


def _build_llada2(directory: Path, config: dict[str, Any]) -> nn.Module:
    from dllm_decode.models.llada2 import LLaDA2Config, LLaDA2Model

    if "use_bias" not in config:   # the reference defaults it to true and zero-fills a missing bias
        names = tensor_names(directory)
        config = {**config, "use_bias": any(n.endswith("attention.dense.bias") for n in names)}
    drop = ("lm_head.weight",) if config.get("tie_word_embeddings") else ()
    return _build_native(directory, config, LLaDA2Config, LLaDA2Model,
                         ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"),
                         drop)


def _build_diffusion_gemma(directory: Path, config: dict[str, Any]) -> nn.Module:
    from dllm_decode.models.diffusion_gemma import build

    sharding = _SHARDING.get()
    return build(directory, config, *(sharding or ()))


_SHARDING: ContextVar[tuple[Any, torch.dtype | None] | None] = ContextVar("sharding", default=None)
"""(ParallelGroups, dtype) while `load_model(tensor_parallel=N > 1)` builds a model."""

_QUANTIZED: ContextVar[Any] = ContextVar("quantized", default=None)
"""The checkpoint's `quant.checkpoint.CheckpointQuantization` while a quantized checkpoint loads."""

_QUANTIZE: ContextVar[Any] = ContextVar("quantize", default=None)
"""The `QuantSpec` of `load_model(quantize=...)` while the float model is built."""


BUILDERS: dict[str, Callable[[Path, dict[str, Any]], nn.Module]] = {   # key: lower-case model_type
    "llada": _build_llada,
    "dream": _build_dream,
    "fast_dllm_qwen": _build_fast_dllm,     # Efficient-Large-Model/Fast_dLLM_v2_*
    "fast_dllm_llama": _build_fast_dllm,    # the same recipe on a Llama backbone (embedded-bd)
    "sdar": _build_sdar,                    # JetLM/SDAR-*-Chat
    "sdar_moe": _build_sdar_moe,
    "llada2_moe": _build_llada2,            # inclusionAI/LLaDA2.0-*
    "llada21_moe": _build_llada2,           # inclusionAI/LLaDA2.1-*
    "diffusion_gemma": _build_diffusion_gemma,  # google/diffusiongemma-* (uniform noise)
}


def _model_kind(config: dict[str, Any]) -> str:
    """"masked", "causal" or "unknown", from `architectures` first, then `model_type`."""
    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                        MODEL_FOR_MASKED_LM_MAPPING_NAMES)

    architectures = config.get("architectures") or []
    if any(str(name).endswith("ForMaskedLM") for name in architectures):
        return "masked"
    if any(str(name).endswith(("ForCausalLM", "LMHeadModel")) for name in architectures):
        return "causal"
    model_type = config.get("model_type")
    if model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not config.get("is_encoder_decoder"):
        return "masked"
    return "causal" if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES else "unknown"


TURN_END_TOKENS = ("<|eot_id|>", "<|im_end|>")   # LLaDA-Instruct, Dream-Instruct: end of the answer


def turn_end_ids(tokenizer, known: tuple[int, ...]) -> tuple[int, ...]:
    """Chat end-of-turn ids the tokenizer defines (they end an answer like EOS), minus `known`."""
    if tokenizer is None:
        return ()
    vocab = tokenizer.get_vocab()
    return tuple(vocab[t] for t in TURN_END_TOKENS if t in vocab and vocab[t] not in known)


def load_model(path: str | Path, dtype: torch.dtype | None = None,
               device: str | torch.device | None = None, trust_remote_code: bool = False,
               runtime: str | None = None, tensor_parallel: int | None = None,
               adapter: str | Path | Sequence[str | Path] | None = None, quantize: Any = None,
               attention: Any = None, kv_cache_dtype: str = "auto") -> nn.Module:
    """Load a DiffusionLM from a local directory, a shipped name (`embedded`) or the HF cache.

    Args:
        path: directory with `config.json` + safetensors (+ tokenizer files), or a name.
        dtype: parameter dtype, a floating `torch.dtype` or its name (`float32`, `bfloat16`,
            `float16`; default float32), checked as the CLI's `--dtype`.
        device: target device or its name (default: CPU), checked as the CLI's `--device`.
        trust_remote_code: allow the directory's own Python code for its tokenizer (Dream-v0's
            `DreamTokenizer`) or, for the generic masked-LM fallback, its model class. LLaDA and
            Dream weights are always built by this package's own code.
        runtime: how the plain-torch models run their blocks, one of
            `models.compact.DLLM_RUNTIMES` (`reference`, `compact`); None: `compact` where it
            covers the model (`models.compact.default_runtime`). Models outside the compact
            runtime's scope ignore `reference`.
        tensor_parallel: shard the model over this many ranks (`dllm_decode.parallel`): the
            process must run under `torchrun` with WORLD_SIZE a multiple of it (the rest is data
            parallel). Each rank reads only its slices of the safetensors files, in the
            checkpoint's dtype unless `dtype` is given, and places them on `device`
            (`cuda` means `cuda:LOCAL_RANK`). None or 1: the whole model in this process.
        adapter: a PEFT LoRA adapter folder (or several, applied in order) merged into the
            weights at load (`dllm_decode.adapters`; safetensors only).
        quantize: quantize the linear layers on load (`dllm_decode.quant`): `int8`, `fp8`,
            `int4` or `int4:GROUP` (or a `QuantSpec`), after tensor-parallel sharding (each rank
            quantizes its shard). A checkpoint that is already quantized (its `config.json` has
            a `quantization_config`: this package's own, compressed-tensors FP8 or GPTQ int4)
            loads quantized without it. Quantized models run the `compact` runtime too (q|k|v and
            gate|up fused from the quantized layers' codes).
        kv_cache_dtype: how the caches that keep K/V (prefix, dual, block, suffix, the captured
            step) store them: `auto` (the model's dtype), `fp8` (e4m3) or `int8`, with a float32
            scale per head per column (`dllm_decode.quant.kv`).
        attention: the attention back end (`models.attention`): `dense` (default) or `sparsed`
            (SparseD, bidirectional families, cache `none`), a name with options
            (`sparsed:select=0.5,tile=32`) or a `{"name": ..., option: value}` mapping.
    Returns:
        The model in eval mode, with `.tokenizer` set (None when the directory has none) and
        `.name_or_path` recording where it came from.
    Raises:
        TypeError: `trust_remote_code` that is not a bool (the string "false" is truthy).
        ModelLoadError: missing or corrupt directory, bad config, unsupported model type (a
            causal LM included), tokenizer without a mask token for a generic masked LM, custom
            code without `trust_remote_code` (the message names `--trust-remote-code`); a
            `runtime` that is unknown or does not cover the model; an attention back end that is
            unknown, badly configured or does not cover the model.
        ParallelError: a `tensor_parallel` that does not fit the world size or the model's
            head / MLP counts (the message lists the legal sizes).
        KVCacheDtypeError: an unknown `kv_cache_dtype` (before anything loads), or fp8/int8 for
            a model without a KV cache.
    """
    from dllm_decode.devices import check_device, check_dtype
    from dllm_decode.quant.kv import kv_store_of, set_kv_cache_dtype

    require_bool(trust_remote_code, "trust_remote_code")
    dtype, device = check_dtype(dtype), check_device(device)
    kv_store = kv_store_of(kv_cache_dtype)
    if not isinstance(path, (str, Path)):
        raise TypeError(f"path must be a directory or a model name, got {type(path).__name__} {path!r}")
    if runtime is not None:
        from dllm_decode.models.compact import DLLM_RUNTIMES

        if runtime not in DLLM_RUNTIMES:
            raise ModelLoadError(f"runtime must be one of {list(DLLM_RUNTIMES)}, got {runtime!r}")
    backend = _attention(attention)                  # a bad back end or option: before any work
    directory = resolve_model_dir(path)
    config = read_config(directory)
    spec, quantized = _quantization(directory, config, quantize, device, tensor_parallel)
    model_type = config.get("model_type")
    builder = BUILDERS.get(str(model_type).lower())
    if builder is None and (kind := _model_kind(config)) != "masked":
        if kind == "causal":
            raise ModelLoadError(f"{directory}: model_type {model_type!r} is a causal "
                                 f"(autoregressive) LM; diffusion decoding needs a masked LM (LLaDA, "
                                 f"Dream or a transformers *ForMaskedLM) or a block-diffusion LM "
                                 f"(Fast-dLLM v2, SDAR, LLaDA2); use it with the AR/speculative mode")
        raise ModelLoadError(f"{directory}: model_type {model_type!r} is not a diffusion LM this "
                             f"toolkit loads; supported: {sorted(BUILDERS)} or any transformers "
                             f"masked LM")
    tokenizer = load_tokenizer(directory, trust_remote_code)
    groups = _tensor_parallel_groups(tensor_parallel, device)
    if groups is not None and builder is None:
        from dllm_decode.parallel import ParallelError

        raise ParallelError(f"{directory}: tensor parallelism covers this package's own model "
                            f"families, not a generic transformers masked LM")
    if quantized is not None and builder is None:
        raise ModelLoadError(f"{directory}: a quantized checkpoint loads for this package's own "
                             f"model families ({sorted(BUILDERS)}), not a generic masked LM")
    tokens = (_QUANTIZED.set(quantized), _QUANTIZE.set(spec))
    try:
        if groups is not None:
            token = _SHARDING.set((groups, dtype))
            try:
                model = builder(directory, config)
            finally:
                _SHARDING.reset(token)
            device = _rank_device(device)
        elif builder is not None:
            model = builder(directory, config)
        else:                                                # generic fallback: any transformers MLM
            from dllm_decode.models.hf import load_masked_lm

            model = load_masked_lm(directory, tokenizer, trust_remote_code)
    finally:
        _QUANTIZE.reset(tokens[1])
        _QUANTIZED.reset(tokens[0])
    if groups is None or dtype is not None:     # TP keeps the checkpoint's dtype unless told
        model = model.to(dtype=dtype or torch.float32)
    if adapter is not None:                     # LoRA merges into the float weights, before quantizing
        from dllm_decode.adapters import merge_folders

        try:
            merge_folders(model, adapter)
        except ValueError as err:
            raise ModelLoadError(first_line(err)) from None
    if spec is not None:                        # after sharding: each rank quantizes its shard
        from dllm_decode.quant import quantize_model

        _quant_problem(directory, lambda: quantize_model(model, spec))
    model = model.to(device=device or "cpu").eval()
    model.tokenizer = tokenizer
    # config.json may leave EOS to the tokenizer (Qwen-based checkpoints): take what it defines
    eos = tuple(e for e in model.eos_token_ids if e is not None)
    if not eos and getattr(tokenizer, "eos_token_id", None) is not None:
        eos = (int(tokenizer.eos_token_id),)
    model.eos_token_ids = eos + turn_end_ids(tokenizer, eos)
    check_token_ids(directory, model)
    check_tokenizer_ids(directory, model, tokenizer)
    model.name_or_path = str(path)
    from dllm_decode.models.compact import default_runtime, set_runtime

    try:
        set_runtime(model, runtime or default_runtime(model))
        if backend is not None:
            from dllm_decode.models.attention import set_attention

            set_attention(model, backend)
    except ValueError as err:
        raise ModelLoadError(f"{directory}: {first_line(err)}") from None
    return set_kv_cache_dtype(model, kv_store)


def _attention(spec: Any) -> Any:
    """`load_model`'s `attention` as a back end object (None: dense), checked on its own."""
    if spec is None:
        return None
    from dllm_decode.models.attention import parse_attention

    try:
        return parse_attention(spec)
    except (ValueError, TypeError) as err:
        raise ModelLoadError(first_line(err)) from None


def _quantization(directory: Path, config: dict[str, Any], quantize: Any, device: Any,
                  tensor_parallel: int | None) -> tuple[Any, Any]:
    """(the `QuantSpec` to quantize to on load, the checkpoint's own quantization), checked
    before anything is built: a bad format, a format the device cannot run, an unknown
    `quantization_config`, a quantized checkpoint asked to quantize again or to shard."""
    from dllm_decode.quant import QuantSpec
    from dllm_decode.quant.checkpoint import checkpoint_quantization
    from dllm_decode.quant.device import check_device_runs

    spec = _quant_problem(directory, lambda: QuantSpec.of(quantize))
    quantized = _quant_problem(directory, lambda: checkpoint_quantization(
        config, str(directory / "config.json")))
    if quantized is not None and spec is not None:
        raise ModelLoadError(f"{directory} is already quantized ({quantized.spec}); leave out "
                             f"quantize")
    if quantized is not None and tensor_parallel and tensor_parallel > 1:
        raise ModelLoadError(f"{directory}: a quantized checkpoint loads in one process; for "
                             f"tensor parallelism quantize the float checkpoint on load (quantize=)")
    for wanted in (spec, quantized.spec if quantized else None):
        if wanted is not None:
            _quant_problem(directory, lambda: check_device_runs(wanted, device))
    return spec, quantized


def _tensor_parallel_groups(tensor_parallel: int | None, device: Any) -> Any:
    """The TP groups for `load_model(tensor_parallel=...)`, or None for a whole model."""
    from dllm_decode.parallel import check_tensor_size, init_parallel

    if tensor_parallel is None or check_tensor_size(tensor_parallel) == 1:
        return None
    return init_parallel(tensor_parallel, device)


def _rank_device(device: torch.device | None) -> torch.device | None:
    """`cuda` without an index becomes this process's `cuda:LOCAL_RANK`."""
    import os

    if device is not None and device.type == "cuda" and device.index is None:
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def mask_id_of(model: nn.Module) -> list[tuple[str, int]]:
    """`[("mask_token_id", id)]`, or [] for a model whose canvas holds noise, not [MASK]."""
    if getattr(model, "canvas_kind", "mask") == "noise":
        return []
    return [("mask_token_id", model.mask_token_id)]


def check_token_ids(directory: Path, model: nn.Module) -> None:
    """The special ids a decode relies on exist in the vocabulary, and [MASK] is not an end of
    text (padding is masked out of attention, so padding may share the EOS id).

    Raises:
        ModelLoadError: naming the directory's config.json, the key and the vocabulary size.
    """
    vocab = int(model.vocab_size)
    if not model.eos_token_ids:
        raise ModelLoadError(f"{directory / 'config.json'}: no eos_token_id, and the tokenizer "
                             f"defines none; set eos_token_id in config.json")
    named = [*mask_id_of(model), *(("eos_token_id", e) for e in model.eos_token_ids)]
    for key, value in named:
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < vocab:
            raise ModelLoadError(f"{directory / 'config.json'}: {key} {value!r} is outside the "
                                 f"vocabulary [0, {vocab})")
    if mask_id_of(model) and model.mask_token_id in model.eos_token_ids:
        raise ModelLoadError(f"{directory / 'config.json'}: mask_token_id {model.mask_token_id} is "
                             f"also an eos_token_id; [MASK] must be its own token")


def check_tokenizer_ids(directory: Path, model: nn.Module, tokenizer: Any) -> None:
    """The model's special ids agree with its tokenizer: [MASK] is the tokenizer's mask token
    when it names one, and every special id the model decodes with ([MASK], each end of text)
    is one of the tokenizer's special or added tokens, not an ordinary word (a config whose mask
    id is a word decodes garbage without an error).

    Raises:
        ModelLoadError: naming config.json, the key, the id and what the tokenizer calls it.
    """
    if tokenizer is None:
        return
    where = directory / "config.json"
    vocab = int(model.vocab_size)
    mask = getattr(tokenizer, "mask_token_id", None)
    if mask_id_of(model) and isinstance(mask, int) and mask != model.mask_token_id and mask < vocab:
        raise ModelLoadError(f"{where}: mask_token_id {model.mask_token_id} differs from the "
                             f"tokenizer's mask token {getattr(tokenizer, 'mask_token', None)!r} "
                             f"(id {mask}); the two must agree")
    try:
        special = {int(i) for i in getattr(tokenizer, "all_special_ids", ()) or () if i is not None}
        special |= {int(i) for i in (tokenizer.get_added_vocab() or {}).values()}
        size = len(tokenizer)
    except Exception:  # noqa: BLE001 - a tokenizer without these views is not checked further
        return
    named = [*mask_id_of(model), *(("eos_token_id", e) for e in model.eos_token_ids)]
    for key, value in named:
        if value < size and value not in special:
            word = tokenizer.convert_ids_to_tokens(value)
            raise ModelLoadError(f"{where}: {key} {value} is the ordinary token {word!r} in the "
                                 f"tokenizer, not a special token; the config and the tokenizer disagree")
