"""lm-evaluation-harness model `dllm_decode`: generation tasks with any scheduler, cache and filter.

lm-eval finds models only through its registry, so run it through this module, which registers
the model and then hands over to lm-eval's own command line (tested with lm_eval 0.4.13). The
local tasks `dllm_copy` and `dllm_sort` (`eval/harness/lm_eval_tasks/`, documents drawn from
`dllm_decode.eval.tasks`, no download) run offline from the repository root:

    HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 python -m dllm_decode.eval.harness.lm_eval_adapter --model dllm_decode \
        --model_args model=embedded,scheduler=threshold,scheduler.threshold=0.9,cache=prefix \
        --tasks dllm_copy,dllm_sort --include_path eval/harness/lm_eval_tasks --limit 10 \
        --device cpu --batch_size 4

`--batch_size` and `--device` are lm-eval's own flags (it always passes them, so they cannot go
in `--model_args`); `--model_args` splits on `,`, so a filter takes at most one option there.
A task's `max_gen_toks` (32 for the local tasks) sets the canvas. Scores are lm-eval's
`exact_match` against the one reference answer: `dllm-decode eval` scores the same outputs alike,
except that its scorer compares words and so forgives spacing.

`lm_eval` is optional (`pip install lm_eval`); without it this module still imports, and
`DllmDecodeLM` works on any object with lm-eval's `Instance.args`. Only `generate_until` is
supported: a masked diffusion LM has no cheap exact log-likelihood.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

import torch

from dllm_decode.config import DecodeConfig
from dllm_decode.eval.harness.runner import generate_rows
from dllm_decode.modelspec import ModelSpec, load_diffusion, parse_options
from dllm_decode.prompts import chat_prompt

try:
    from lm_eval.api.model import LM as _LMBase
    from lm_eval.api.registry import register_model
except ImportError:                      # the adapter stays importable without the harness
    _LMBase = object

    def register_model(*names: str):
        return lambda cls: cls
else:
    # lm-eval fills its model registry with its own models only while the registry is empty, so
    # registering first would hide `hf`, `vllm`... from every `get_model` in this process.
    import lm_eval.models  # noqa: F401

TASKS_DIR = Path(__file__).with_name("lm_eval_tasks")
"""Local generation tasks `dllm_copy` and `dllm_sort` (pass as `--include_path`)."""


def _device(device: str | None) -> str | None:
    """lm-eval's command line passes `cuda:0` unless told otherwise; without CUDA use the CPU."""
    if device and str(device).startswith("cuda") and not torch.cuda.is_available():
        warnings.warn(f"device {device!r} requested but CUDA is not available; using the CPU",
                      stacklevel=3)
        return "cpu"
    return device


def _load(model: Any, device: str | None, dtype: str | None, trust_remote_code: bool = False) -> Any:
    if not isinstance(model, str):
        return model
    import torch

    dtypes = {None: None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in dtypes:
        raise ValueError(f"dtype must be one of {sorted(k for k in dtypes if k)}, got {dtype!r}")
    return load_diffusion(ModelSpec.parse(model), device=_device(device), dtype=dtypes[dtype],
                          trust_remote_code=trust_remote_code)


def _as_bool(value: Any) -> bool:
    return value if isinstance(value, bool) else str(value).lower() in {"1", "true", "yes"}


@register_model("dllm_decode")
class DllmDecodeLM(_LMBase):
    """Decode lm-eval requests with `dllm_decode.generate`.

    Args:
        model: checkpoint directory, `embedded`, `tiny`, or a loaded DiffusionLM.
        scheduler, cache: registry names; `scheduler.<field>=v` / `cache.<field>=v` set fields.
        filters: `name` or `name:key=value` entries joined by `;`.
        gen_length: canvas length; a request's `max_gen_toks` rounds up to whole blocks.
        block_length: semi-AR block (default: the whole canvas).
        temperature, seed: as `DecodeConfig`.
        batch_size: requests per `generate` call (an integer: no `auto`).
        max_batch_size: accepted for lm-eval's `--max_batch_size` and ignored (no auto batching).
        device, dtype: where and in what to load a named model; a CUDA device without CUDA (lm-eval's
            command line defaults to `cuda:0`) falls back to the CPU with a warning.
        chat_template: wrap each context in the tokenizer's chat template when it has one.
        trust_remote_code: let a named checkpoint run its own tokenizer code (Dream-v0's
            `DreamTokenizer`); `trust_remote_code=True` in `--model_args`. Off by default.
    Raises:
        ValueError: unknown names or options, bad values.
    """

    def __init__(self, model: Any = "embedded", scheduler: str = "threshold", cache: str = "none",
                 filters: str = "", gen_length: int | str = 128, block_length: int | str | None = None,
                 temperature: float | str = 0.0, seed: int | str = 0, batch_size: int | str = 1,
                 chat_template: bool | str = True, device: str | None = None,
                 dtype: str | None = None, max_batch_size: int | None = None,
                 trust_remote_code: bool | str = False, **options: Any):
        super().__init__()
        bad = [k for k in options if not k.startswith(("scheduler.", "cache."))]
        if bad:
            raise ValueError(f"unknown model_args {sorted(bad)}; use scheduler.<field> or cache.<field>")
        pick = lambda prefix: {k[len(prefix):]: str(v) for k, v in options.items()  # noqa: E731
                               if k.startswith(prefix)}
        self.block_length = None if block_length in (None, "None", "") else int(block_length)
        gen_length = int(gen_length)
        self.config = DecodeConfig.from_dict({
            "scheduler": {"name": scheduler, **pick("scheduler.")},
            "cache": {"name": cache, **pick("cache.")},
            "filters": [{"name": name.strip(), **dict(parse_options(rest))}
                        for name, _, rest in (part.partition(":") for part in str(filters).split(";")
                                              if part.strip())],
            "gen_length": gen_length, "block_length": self.block_length or gen_length,
            "temperature": float(temperature), "seed": int(seed)})
        if not str(batch_size).isdigit() or int(batch_size) < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        self.model = _load(model, device, dtype, _as_bool(trust_remote_code))
        self.tokenizer = getattr(self.model, "tokenizer", None)
        self.batch_size = int(batch_size)
        self.chat_template = _as_bool(chat_template)
        self.generator = torch.Generator().manual_seed(int(seed))

    def _canvas(self, max_tokens: Any) -> DecodeConfig:
        """A request's decode record: its `max_gen_toks` rounded up to whole blocks (the
        configured `gen_length` without one)."""
        if max_tokens is None:
            return self.config
        block = self.block_length
        length = -(-int(max_tokens) // block) * block if block else int(max_tokens)
        return dataclasses.replace(self.config, gen_length=length, block_length=block or length)

    def generate_until(self, requests: list[Any]) -> list[str]:
        """Each request's `args` is `(context, gen_kwargs)`; output is cut at the first `until`."""
        outputs: list[str | None] = [None] * len(requests)
        groups: dict[DecodeConfig, list[int]] = {}
        for i, request in enumerate(requests):
            _, kwargs = request.args
            groups.setdefault(self._canvas((kwargs or {}).get("max_gen_toks")), []).append(i)
        for config, indices in groups.items():
            for start in range(0, len(indices), self.batch_size):
                chunk = indices[start:start + self.batch_size]
                prompts = [chat_prompt(self.tokenizer, requests[i].args[0], self.chat_template)
                           for i in chunk]
                rows, _ = generate_rows(self.model, prompts, config, self.generator, self.tokenizer)
                for i, row in zip(chunk, rows):
                    outputs[i] = _cut(row["output"], (requests[i].args[1] or {}).get("until"))
        return [text or "" for text in outputs]

    def loglikelihood(self, requests: list[Any]) -> list[tuple[float, bool]]:
        raise NotImplementedError("dllm_decode runs generation tasks only (generate_until)")

    def loglikelihood_rolling(self, requests: list[Any]) -> list[float]:
        raise NotImplementedError("dllm_decode runs generation tasks only (generate_until)")


def _cut(text: str, until: Any) -> str:
    stops = [until] if isinstance(until, str) else list(until or [])
    cut = min((text.find(s) for s in stops if s and s in text), default=len(text))
    return text[:cut]


def main() -> None:
    """Register `dllm_decode`, then run lm-eval's command line."""
    try:
        from lm_eval.__main__ import cli_evaluate
    except ImportError:
        raise SystemExit("lm-evaluation-harness is not installed: pip install lm_eval") from None
    cli_evaluate()


if __name__ == "__main__":
    main()
