"""lm-evaluation-harness model `dllm_decode`: generation tasks with any scheduler, cache and filter.

lm-eval finds models only through its registry, so run it through this module, which registers
the model and then hands over to lm-eval's own command line (tested with lm_eval 0.4.13). The
local tasks `dllm_copy` and `dllm_sort` (`TASKS_DIR`, installed with the package, documents
drawn from `dllm_decode.eval.tasks`, no download) run offline from any directory (the command
adds `--include_path TASKS_DIR` itself when it is not given):

    HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 python -m dllm_decode.eval.harness.lm_eval_adapter --model dllm_decode \
        --model_args model=embedded,scheduler=threshold,scheduler.threshold=0.9,cache=prefix \
        --tasks dllm_copy,dllm_sort --limit 10 --device cpu --batch_size 4

`--batch_size` and `--device` are lm-eval's own flags (it always passes them, so they cannot go
in `--model_args`); `--model_args` splits on `,`, so a filter takes at most one option there.
A task's `max_gen_toks` (32 for the local tasks) sets the canvas. Scores are lm-eval's
`exact_match` against the one reference answer: `dllm-decode eval` scores the same outputs alike,
except that its scorer compares words and so forgives spacing.

Multiple-choice and perplexity tasks (`loglikelihood`, `loglikelihood_rolling`) are scored with
LLaDA's Monte-Carlo ELBO (`dllm_decode.likelihood`; model args `mc_num`, `mc_batch`, `cfg`): a
lower bound on the log-likelihood, so perplexities are upper bounds. The local multiple-choice
tasks `dllm_sort_mc` and `dllm_copy_mc` (the answer among three other orders of its words, chance
25%) run the same way:

    HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 dllm-lm-eval --model dllm_decode \
        --model_args model=embedded,mc_num=32,mc_batch=32 --tasks dllm_sort_mc --device cpu

`dllm-lm-eval` is lm-eval's own command line with this model registered (the same as
`python -m dllm_decode.eval.harness.lm_eval_adapter`). lm-eval 0.4.13 (the newest release) finds
models only in its own registry; the package also declares the `lm_eval.models` entry point for
releases that discover model plugins.

Data-parallel under `torchrun --nproc_per_node N -m dllm_decode.eval.harness.lm_eval_adapter ...`
or `accelerate launch`: the model joins the process group the launcher describes (`WORLD_SIZE`,
`RANK`; gloo on CPUs, NCCL on GPUs, each rank on `cuda:LOCAL_RANK`) and reports `rank` and
`world_size`, so lm-eval gives each process every N-th document and gathers the scores on rank 0
(without them every process would evaluate everything). The two `Accelerator` calls lm-eval's
evaluator makes when `world_size > 1` (`gather`, `wait_for_everyone`) are answered by
`torch.distributed`, so `accelerate` itself is not needed.

`lm_eval` is optional (`pip install lm_eval`); without it this module still imports, and
`DllmDecodeLM` works on any object with lm-eval's `Instance.args`.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

import torch

from dllm_decode.config import DecodeConfig
from dllm_decode.eval.harness.runner import generate_rows
from dllm_decode.likelihood import loglikelihood
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
"""Local tasks: generation `dllm_copy`, `dllm_sort`; multiple choice `dllm_copy_mc`,
`dllm_sort_mc`. `dllm-lm-eval` includes this folder itself (installed with the package) unless
the command gives its own `--include_path`."""


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


class Collectives:
    """What lm-eval's evaluator asks of `lm.accelerator` when `world_size > 1`, on
    `torch.distributed`'s default group (as `accelerate.Accelerator` answers it)."""

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's `tensor` concatenated along dim 0 in rank order (0-d tensors stacked)."""
        import torch.distributed as dist

        parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, tensor.contiguous())
        return torch.stack(parts) if tensor.dim() == 0 else torch.cat(parts)

    def wait_for_everyone(self) -> None:
        import torch.distributed as dist

        dist.barrier()


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
        chat_template: wrap each generation context in the tokenizer's chat template when it has
            one (log-likelihood contexts are scored as given, as LLaDA's evaluation does).
        trust_remote_code: let a named checkpoint run its own tokenizer code (Dream-v0's
            `DreamTokenizer`); `trust_remote_code=True` in `--model_args`. Off by default.
        mc_num, mc_batch, cfg: the log-likelihood estimator (`dllm_decode.likelihood`): noisy
            copies per (context, continuation), copies per forward, classifier-free guidance.
    Attributes:
        rank, world_size: this process's place among the launcher's processes (0 of 1 when not
            launched by `torchrun` / `accelerate launch`): lm-eval shards its documents by them.
    Raises:
        ValueError: unknown names or options, bad values.
    """

    def __init__(self, model: Any = "embedded", scheduler: str = "threshold", cache: str = "none",
                 filters: str = "", gen_length: int | str = 128, block_length: int | str | None = None,
                 temperature: float | str = 0.0, seed: int | str = 0, batch_size: int | str = 1,
                 chat_template: bool | str = True, device: str | None = None,
                 dtype: str | None = None, max_batch_size: int | None = None,
                 trust_remote_code: bool | str = False, mc_num: int | str = 128,
                 mc_batch: int | str = 32, cfg: float | str = 0.0, **options: Any):
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
        if not (str(batch_size).isascii() and str(batch_size).isdigit()) or int(batch_size) < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        from dllm_decode.eval.harness import distributed

        self._rank, self._world_size = distributed.init_from_env(device)
        if self._world_size > 1:
            self.accelerator = Collectives()
            device = distributed.local_device("cuda" if str(device or "").startswith("cuda")
                                              else device)
        self.model = _load(model, device, dtype, _as_bool(trust_remote_code))
        self.tokenizer = getattr(self.model, "tokenizer", None)
        self.batch_size = int(batch_size)
        self.chat_template = _as_bool(chat_template)
        self.generator = torch.Generator().manual_seed(int(seed))
        self.seed = int(seed)
        self.mc_num, self.mc_batch, self.cfg = int(mc_num), int(mc_batch), float(cfg)
        if self.mc_batch < 1 or self.mc_num < self.mc_batch or self.mc_num % self.mc_batch:
            raise ValueError(f"mc_num ({mc_num}) must be a positive multiple of mc_batch ({mc_batch})")
        if not self.cfg >= 0:
            raise ValueError(f"cfg must be >= 0, got {cfg}")

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def device(self) -> torch.device:
        """Where the model's weights are (lm-eval puts its gather tensors there)."""
        weights = next(iter(self.model.parameters()), None) if hasattr(self.model, "parameters") \
            else None
        return weights.device if weights is not None else torch.device("cpu")

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
        """Each request's `args` is `(context, continuation)`: the ELBO estimate of
        `log p(continuation | context)`, and False for "is greedy" (not computed: LLaDA's own
        evaluation turns that check off for multiple-choice tasks)."""
        return [(self._score(*self._encode_pair(*request.args)), False) for request in requests]

    def loglikelihood_rolling(self, requests: list[Any]) -> list[float]:
        """Each request's `args` is `(text,)`: the summed ELBO over lm-eval's disjoint rolling
        windows of the model's context, the first conditioned on one end-of-text token."""
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        limit = getattr(self.model, "max_length", None) or 4096
        scores = []
        for request in requests:
            (text,) = request.args
            windows = get_rolling_token_windows(token_list=self._encode(text),
                                                prefix_token=self.model.eos_token_ids[0],
                                                max_seq_len=limit, context_len=1)
            scores.append(sum(self._score(*make_disjoint_window(w)) for w in windows))
        return scores

    def _score(self, context: list[int], continuation: list[int]) -> float:
        """The estimate, the context cut from the left to fit the model's context (lm-eval's HF
        models do the same)."""
        limit = getattr(self.model, "max_length", None)
        if limit is not None:
            context = context[max(0, len(context) + len(continuation) - limit):]
        return loglikelihood(self.model, context, continuation, mc_num=self.mc_num,
                             mc_batch=self.mc_batch, cfg=self.cfg, seed=self.seed)

    def _encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("log-likelihood requests are text: the model needs a tokenizer")
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """lm-eval's convention: trailing spaces of the context move to the continuation, and
        the pair is tokenised whole and split after the context's tokens (so a merge across
        the boundary is scored as part of the continuation)."""
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = self._encode(context + continuation)
        head = len(self._encode(context)) if context else 0
        return whole[:head], whole[head:]


def _cut(text: str, until: Any) -> str:
    stops = [until] if isinstance(until, str) else list(until or [])
    cut = min((text.find(s) for s in stops if s and s in text), default=len(text))
    return text[:cut]


def with_task_folder(argv: list[str]) -> list[str]:
    """`argv` with `--include_path TASKS_DIR` added when it names no include path, so the local
    tasks resolve from any directory, a wheel install included."""
    if any(a == "--include_path" or a.startswith("--include_path=") for a in argv[1:]):
        return argv
    return [argv[0], "--include_path", str(TASKS_DIR), *argv[1:]]


def main() -> None:
    """Register `dllm_decode`, then run lm-eval's command line (with the local task folder)."""
    import sys

    try:
        from lm_eval.__main__ import cli_evaluate
    except ImportError:
        raise SystemExit("lm-evaluation-harness is not installed: pip install lm_eval") from None
    sys.argv = with_task_folder(sys.argv)
    cli_evaluate()


if __name__ == "__main__":
    main()
