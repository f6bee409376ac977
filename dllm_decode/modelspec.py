"""The `--model` name language, parsed once into a typed `ModelSpec` (CLI, eval, bench, lm-eval).

    embedded | ar_target | /path/to/dir | org/name     a model by directory, shipped name or HF cache id
    tiny                                             the seeded random test LLaDA
    ideal[:noise=X]                                  ParallelBench's ideal analytic model (eval)
    ar:TARGET[+DRAFT][@RUNTIME]                      a causal LM: plain AR, or speculative with DRAFT
                                                     (`ar_draft`, `lookup:3`, `layerskip:2`, `dllm`...),
                                                     its target run by transformers (`@hf`, default)
                                                     or the compact runtime (`@compact`)

Parsing imports nothing heavy; loading is done by whoever needs the model (`load_diffusion` here
for the first two kinds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dllm_decode.option_text import parse_options

KINDS = ("diffusion", "tiny", "ideal", "ar")
RUNTIMES = ("hf", "compact")


@dataclass(frozen=True)
class ModelSpec:
    """What a model name means.

    Attributes:
        kind: `diffusion` (a masked diffusion LM: directory, shipped name or HF cache id),
            `tiny`, `ideal`, or `ar` (a causal LM, the AR / speculative baseline).
        name: the directory or name (diffusion, and the AR target).
        options: `key=value` options (`ideal:noise=0.01`).
        draft: the AR draft as `--draft` takes it (`ar_draft`, `lookup:3`, ...); "" for plain AR.
        runtime: how the AR target runs: `hf` or `compact`.
    """

    kind: str
    name: str = ""
    options: tuple[tuple[str, str], ...] = ()
    draft: str = ""
    runtime: str = "hf"

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        """Parse a model name.

        Raises:
            ValueError: an empty name or target, or a malformed `key=value` option.
        """
        if not isinstance(text, str) or not text.strip():
            raise ValueError("the model name is empty; give a directory, `embedded`, `tiny`, "
                             "`ideal` or `ar:TARGET[+DRAFT]`")
        text = text.strip()
        if text == "tiny":
            return cls("tiny", "tiny")
        if text == "ideal" or text.startswith("ideal:"):
            return cls("ideal", "ideal", parse_options(text.partition(":")[2]))
        if text.startswith("ar:"):
            body, runtime = text[len("ar:"):], "hf"
            head, at, tail = body.rpartition("@")
            if at and tail in RUNTIMES:
                body, runtime = head, tail
            elif at and "/" not in tail and head.strip():
                raise ValueError(f"{text!r}: unknown runtime {tail!r}; choose from "
                                 f"{'|'.join(RUNTIMES)}")
            target, _, draft = body.partition("+")
            if not target.strip():
                raise ValueError(f"{text!r}: `ar:` needs a target model (e.g. `ar:ar_target`)")
            return cls("ar", target.strip(), draft=draft.strip(), runtime=runtime)
        return cls("diffusion", text)

    def __str__(self) -> str:
        """The canonical text (parses back to an equal spec)."""
        if self.kind == "ideal":
            options = ",".join(f"{k}={v}" for k, v in self.options)
            return f"ideal:{options}" if options else "ideal"
        if self.kind == "ar":
            draft = f"+{self.draft}" if self.draft else ""
            return f"ar:{self.name}{draft}" + (f"@{self.runtime}" if self.runtime != "hf" else "")
        return self.name


def load_diffusion(spec: ModelSpec, device: Any = None, dtype: Any = None,
                   trust_remote_code: bool = False, runtime: str | None = None,
                   tensor_parallel: int | None = None, adapter: Any = None, quantize: Any = None,
                   attention: Any = None) -> Any:
    """A `diffusion` or `tiny` spec -> the loaded DiffusionLM (with `.tokenizer`);
    `trust_remote_code`, `runtime`, `tensor_parallel`, `adapter`, `quantize` and `attention` as
    `dllm_decode.models.load_model` (`tiny` is built whole, then sharded and quantized in memory).

    Raises:
        ValueError: another kind of spec; `ModelLoadError` (a ValueError) for a missing or corrupt
            directory.
    """
    if spec.kind == "tiny":
        from dllm_decode.testing import tiny_llada_with_tokenizer

        from dllm_decode.models.compact import set_runtime

        model = tiny_llada_with_tokenizer()
        if tensor_parallel and tensor_parallel > 1:
            from dllm_decode.parallel import init_parallel, shard_model

            model = shard_model(model, init_parallel(tensor_parallel, device))
        if quantize is not None:
            from dllm_decode.quant import quantize_model

            model = quantize_model(model, quantize)
        model = model.to(device or "cpu")
        if adapter is not None:
            from dllm_decode.adapters import merge_folders

            merge_folders(model, adapter)
        model = model if runtime is None else set_runtime(model, runtime)
        if attention is not None:
            from dllm_decode.models.attention import set_attention

            set_attention(model, attention)
        return model
    if spec.kind != "diffusion":
        raise ValueError(f"{str(spec)!r} is not a diffusion LM name")
    from dllm_decode.models.loading import load_model

    return load_model(spec.name, dtype=dtype, device=device, trust_remote_code=trust_remote_code,
                      runtime=runtime, tensor_parallel=tensor_parallel, adapter=adapter, quantize=quantize,
                      attention=attention)
