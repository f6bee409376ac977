"""Parsing every command shares: `KEY=VALUE` options, `NAME[:KEY=VALUE,...]` specs, the decode
record from its options, model names, devices and dtypes, and `ValueError` -> usage error.

Imports only click at module level: `dllm-decode --help` must not wait for torch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import click

from dllm_decode.cli.numbers import ascii_numbers
from dllm_decode.cost import CORES, MAX_CANVAS, MAX_PROMPTS  # noqa: F401 - the commands' bounds, re-exported
from dllm_decode.modelspec import ModelSpec, parse_options

DTYPES = ("float32", "bfloat16", "float16")

TRUST_HELP = ("Let a checkpoint run its own Python code (e.g. Dream-v0's DreamTokenizer). Only for "
              "directories you trust.")

ascii_numbers()                 # every numeric option of every command, in one place


class RegistryHelp(click.Option):
    """A click option whose help is computed when it is shown (`help` is a callable), so lists
    of accepted names come from the registries, and `--help` of commands without such an option
    imports no registry (nor torch)."""

    def __init__(self, *args: Any, help: Any = None, **kwargs: Any) -> None:  # noqa: A002
        self._help_source = help
        super().__init__(*args, **kwargs)

    @property
    def help(self) -> str | None:  # type: ignore[override]
        source = self._help_source
        return source() if callable(source) else source

    @help.setter
    def help(self, value: Any) -> None:
        if value is not None:
            self._help_source = value


def registry_names(kind: str) -> str:
    """`a, b, c`: the registered names of one kind of component, in registry order (read without
    importing the plugins, so help stays torch-free)."""
    from dllm_decode.registry import names

    return ", ".join(names(kind))


def natural_gen_length(model: Any) -> int | None:
    """The generation length a model declares as its own: a `gen_length` attribute, or
    `max_new_tokens` in its checkpoint's `generation_config.json` (the file transformers reads
    for `generate`'s defaults). None when it declares none."""
    import json

    declared = getattr(model, "gen_length", None)
    if isinstance(declared, int) and not isinstance(declared, bool) and declared >= 1:
        return declared
    name = getattr(model, "name_or_path", None)
    if not name:
        return None
    from dllm_decode.models.checkpoint import resolve_model_dir

    try:
        path = resolve_model_dir(name) / "generation_config.json"
        value = json.loads(path.read_text(encoding="utf-8")).get("max_new_tokens")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


class FloatRange(click.FloatRange):
    """click's `FloatRange`, refusing NaN (it compares False with every bound, so click's own
    range check lets it through). Every float option of the CLI uses this one."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        out = super().convert(value, param, ctx)
        if out != out:
            self.fail(f"{value!r} is not a number", param, ctx)
        return out


def trust_option(command: Any) -> Any:
    """`--trust-remote-code`: the opt-in transformers asks for (off by default)."""
    return click.option("--trust-remote-code", "trust_remote_code", is_flag=True, default=False,
                        help=TRUST_HELP)(command)


RUNTIME_HELP = ("How a plain-torch diffusion model (LLaDA, Dream, Fast-dLLM v2, SDAR, the embedded "
                "models) runs its blocks: `reference` (the modules as written) or `compact` (fused "
                "projections sharing the model's weights, rotary table lookup; same logits to float "
                "rounding) [compact where it covers the model].")


CAPTURE_HELP = {
    "cuda_graphs": "Run each step's model forward as a CUDA graph recorded per bucket (batch, "
                   "canvas, window) and replayed (CUDA only; diffusion models). Off by default: no "
                   "GPU measurement has shown it faster yet.",
    "compile": "Run each step's model forward through torch.compile (inductor, fullgraph, one "
               "graph per bucket, compiled on first use and reused by later batches; diffusion "
               "models). Off by default: on this project's CPU measurement it was not faster "
               "everywhere.",
}


def capture_options(command: Any) -> Any:
    """`--cuda-graphs/--no-cuda-graphs` and `--compile/--no-compile` (`dllm_decode.capture`)."""
    command = click.option("--compile/--no-compile", "compile_step", default=False,
                           show_default=True, help=CAPTURE_HELP["compile"])(command)
    return click.option("--cuda-graphs/--no-cuda-graphs", default=False, show_default=True,
                        help=CAPTURE_HELP["cuda_graphs"])(command)


def capture_mode(cuda_graphs: bool, compile_step: bool, device: Any, spec: Any = None) -> str:
    """The `capture` keyword of `generate` / `Decoding` / `Engine` for the two flags, checked
    the same way by every command that decodes (usage errors when they clash, the device has no
    CUDA, or the model `spec` names is a causal LM)."""
    if cuda_graphs and compile_step:
        raise click.UsageError("--cuda-graphs and --compile are alternatives; give one")
    if cuda_graphs and getattr(device, "type", str(device)) != "cuda":
        raise click.UsageError(f"--cuda-graphs needs a CUDA device (--device cuda), got {device}")
    mode = "cuda-graphs" if cuda_graphs else "compile" if compile_step else "off"
    if mode != "off" and getattr(spec, "kind", None) == "ar":
        raise click.UsageError(f"--{'cuda-graphs' if cuda_graphs else 'compile'} captures a diffusion "
                               f"model's step; {str(spec)!r} is a causal LM (leave the flag out)")
    if mode != "off":                     # the first step of each shape is captured: say so, not silence
        click.echo(f"--{'cuda-graphs' if cuda_graphs else 'compile'}: the first step of each batch shape is "
                   f"{'recorded' if cuda_graphs else 'compiled (torch.compile, often minutes)'} before it "
                   f"runs; later steps of that shape reuse it", err=True)
    return mode


def runtime_option(command: Any) -> Any:
    """`--runtime`: the diffusion model's runtime (`models.compact.DLLM_RUNTIMES`)."""
    return click.option("--runtime", type=click.Choice(["reference", "compact"]), default=None,
                        help=RUNTIME_HELP)(command)


QUANTIZE_HELP = ("Quantize the diffusion model's linear layers on load (weight-only): int8 or fp8 "
                 "per output channel, int4 group-wise as int4:GROUP (int4 alone: group 128). A "
                 "quantized checkpoint (`dllm-decode quantize`, compressed-tensors FP8, GPTQ "
                 "int4) loads quantized without it.")


def quantize_option(command: Any) -> Any:
    """`--quantize`: weight-only quantization on load (`dllm_decode.quant`), checked at parse."""
    return click.option("--quantize", default=None, metavar="int8|fp8|int4[:GROUP]",
                        callback=_check_quantize, help=QUANTIZE_HELP)(command)


KV_CACHE_DTYPES = ("auto", "fp8", "int8")
"""`dllm_decode.quant.kv.KV_CACHE_DTYPES`, spelled here so parsing imports no torch."""

KV_CACHE_DTYPE_HELP = ("How the caches that keep K/V (prefix, dual, block, suffix, captured steps) "
                       "store them: auto (the model's dtype), fp8 (e4m3) or int8, each with a "
                       "float32 scale per head per column. With --cache none nothing is stored "
                       "and it has no effect.")


def kv_cache_dtype_option(command: Any) -> Any:
    """`--kv-cache-dtype auto|fp8|int8` (vLLM's name): the loaded model's K/V store."""
    return click.option("--kv-cache-dtype", "kv_cache_dtype", type=click.Choice(KV_CACHE_DTYPES),
                        default="auto", show_default=True, help=KV_CACHE_DTYPE_HELP)(command)


def _check_quantize(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    from dllm_decode.quant.spec import QuantError, QuantSpec

    try:
        return str(QuantSpec.parse(value))
    except QuantError as err:
        raise click.BadParameter(str(err), param_hint="--quantize") from None


def key_values(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    """Click callback: `-o key=value` (repeatable) -> dict; a missing `=` is a usage error."""
    out: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", ctx=ctx, param=param)
        out[key.strip()] = value.strip()
    return out


def parse_spec(text: str) -> tuple[str, dict[str, str]]:
    """`NAME[:key=value,key=value]` -> (name, options). Raises ValueError on a malformed option."""
    name, _, rest = text.partition(":")
    return name.strip(), dict(parse_options(rest))


@contextlib.contextmanager
def usage_errors(hint: str | None = None) -> Iterator[None]:
    """Turn a `ValueError`/`TypeError` (bad user input, one line) into click's usage error (exit 2),
    naming the option `hint` when there is one; a model that produces NaN logits is a one-line
    error too (exit 1)."""
    from dllm_decode.errors import NonFiniteLogits

    try:
        yield
    except (ValueError, TypeError) as err:
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if hint:
            raise click.BadParameter(message, param_hint=hint) from None
        raise click.UsageError(message) from None
    except NonFiniteLogits as err:           # a model problem, not a usage error: exit 1
        raise click.ClickException(str(err)) from None


def decode_config(*, scheduler: Any, scheduler_options: Mapping[str, str], cache: str = "none",
                  cache_options: Mapping[str, str] | None = None, filters: Sequence[str] = (),
                  **fields: Any) -> Any:
    """The `DecodeConfig` the decoding options describe (`scheduler`: a registry name, or an
    already built scheduler); each bad part is a usage error naming its option."""
    from dllm_decode.config import DecodeConfig
    from dllm_decode.registry import component

    with usage_errors("--scheduler / -o"):
        if isinstance(scheduler, str):                    # `--scheduler wino:threshold=0.5` too
            name, inline = parse_spec(scheduler)
            scheduler = component("scheduler", {"name": name, **inline, **scheduler_options})
        scheduler_obj = scheduler
    with usage_errors("--cache / -c"):
        name, inline = parse_spec(cache)                  # `--cache elastic:track_num=4` too
        cache_obj = component("cache", {"name": name, **inline, **(cache_options or {})})
    with usage_errors("--filter"):
        filter_objs = tuple(component("filter", {"name": name, **options})
                            for name, options in map(parse_spec, filters))
    with usage_errors():
        return DecodeConfig(scheduler=scheduler_obj, cache=cache_obj, filters=filter_objs, **fields)


def model_spec(text: str, hint: str = "--model") -> ModelSpec:
    with usage_errors(hint):
        return ModelSpec.parse(text)


def device_option(text: str | None) -> Any:
    """`--device` text -> a torch device the machine has (default: the CPU).

    Raises:
        click.BadParameter: not a device name, or one this torch build or machine lacks.
    """
    from dllm_decode.devices import check_device

    try:
        return check_device(text)
    except (TypeError, ValueError) as err:
        raise click.BadParameter(str(err), param_hint="--device") from None


def torch_dtype(name: str | None) -> Any:
    """`--dtype` text (one of `DTYPES`) -> a torch dtype, or None for the model's default."""
    if name is None:
        return None
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def load_diffusion_model(spec: ModelSpec, device: Any = None, dtype: str | None = None,
                         gen_length: int = 128, hint: str = "--model",
                         trust_remote_code: bool = False, runtime: str | None = None,
                         tensor_parallel: int = 1, adapter: tuple[str, ...] = (),
                         quantize: str | None = None, attention: str | None = None,
                         kv_cache_dtype: str = "auto") -> Any:
    """A diffusion, tiny or ideal spec -> the model; load errors are usage errors.

    `ideal` is ParallelBench's analytic model built for a canvas of `gen_length`, with the task
    suite's tokenizer. `trust_remote_code` (`--trust-remote-code`) lets a checkpoint's own
    tokenizer code run; `runtime` (`--runtime`) and `quantize` (`--quantize`) as `load_model`
    takes them; `adapter` (`--adapter`): LoRA folders merged at load (before quantizing);
    `attention` (`--attention`): the attention back end (`models.attention`).
    `kv_cache_dtype` (`--kv-cache-dtype`) the model's K/V store (`dllm_decode.quant.kv`).
    """
    if quantize is not None and spec.kind not in ("diffusion", "tiny"):
        raise click.BadParameter(f"--quantize applies to a diffusion LM checkpoint, not "
                                 f"{str(spec)!r}", param_hint="--quantize")
    if attention is not None and spec.kind not in ("diffusion", "tiny"):
        raise click.BadParameter(f"--attention applies to a diffusion LM checkpoint, not "
                                 f"{str(spec)!r}", param_hint="--attention")
    if kv_cache_dtype != "auto" and spec.kind not in ("diffusion", "tiny"):
        raise click.BadParameter(f"--kv-cache-dtype applies to a diffusion LM checkpoint, not "
                                 f"{str(spec)!r}", param_hint="--kv-cache-dtype")
    if tensor_parallel > 1 and spec.kind not in ("diffusion", "tiny"):
        raise click.BadParameter(f"--tensor-parallel shards a diffusion LM checkpoint; "
                                 f"{str(spec)!r} is not one", param_hint=hint)
    if spec.kind == "ideal":
        from dllm_decode.eval.theory.ideal import ideal_model

        from dllm_decode.models.compact import set_runtime

        with usage_errors(hint):
            model = ideal_model(gen_length, dict(spec.options))
        with usage_errors("--runtime"):
            return model if runtime is None else set_runtime(model, runtime)
    if spec.kind == "ar":
        raise click.BadParameter(f"{str(spec)!r} is a causal LM; this command needs a masked "
                                 f"diffusion LM (use it with `dllm-decode spec` or `eval`)",
                                 param_hint=hint)
    from dllm_decode.modelspec import load_diffusion

    with usage_errors(hint):
        model = load_diffusion(spec, device=device, dtype=torch_dtype(dtype),
                               trust_remote_code=trust_remote_code, runtime=runtime,
                               tensor_parallel=tensor_parallel, quantize=quantize,
                               adapter=list(adapter) or None, attention=attention)
    from dllm_decode.quant.kv import set_kv_cache_dtype

    with usage_errors("--kv-cache-dtype"):
        return set_kv_cache_dtype(model, kv_cache_dtype)


def read_prompt(prompt: str | None) -> str:
    """`--prompt`, or standard input when it is omitted; an empty prompt is a usage error."""
    import sys

    if prompt is None:
        stream = sys.stdin
        if stream is None or stream.isatty():
            prompt = ""
        else:
            data = stream.buffer.read() if hasattr(stream, "buffer") else stream.read()
            if isinstance(data, bytes):
                try:
                    data = data.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise click.BadParameter(f"standard input is not UTF-8 text (byte {err.start})",
                                             param_hint="--prompt") from None
            prompt = data
    if not prompt.strip():
        raise click.BadParameter("the prompt is empty", param_hint="--prompt")
    return prompt


def writable_file(path: str, hint: str) -> Any:
    """Check an output file before any work starts (nothing computed is lost to a bad path):
    its folder is created when missing, and the file is really opened for writing (appending
    to an existing one, so nothing in it is lost; a new one is removed again): permission bits
    say nothing to root, and places like /proc refuse files whatever they say. Returns the `Path`."""
    from pathlib import Path

    from dllm_decode.outputs import OutputError, check_output

    try:
        target = check_output(path, "output file")      # empty names and special files refused
    except OutputError as err:
        raise click.BadParameter(str(err), param_hint=hint) from None
    if target.is_dir():
        raise click.BadParameter(f"{path!r} is a directory; give a file path", param_hint=hint)
    writable_dir(str(target.parent), hint)
    existed = target.exists()
    try:
        with open(target, "ab" if existed else "xb"):
            pass
    except OSError as err:
        raise click.BadParameter(f"cannot write {path!r}: {err.strerror or err}", param_hint=hint) from None
    if not existed:
        target.unlink(missing_ok=True)
    return target


def writable_dir(path: str, hint: str) -> Any:
    """Create an output folder (with its parents) and check a file can really be created in it
    (a throw-away one, removed again). Returns the `Path`."""
    import tempfile
    from pathlib import Path

    if not str(path).strip():
        raise click.BadParameter("the folder name is empty (it would mean the current directory); "
                                 "give a folder", param_hint=hint)
    folder = Path(path).expanduser()
    if folder.exists() and not folder.is_dir():
        raise click.BadParameter(f"{path!r} exists and is not a directory", param_hint=hint)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as err:
        raise click.BadParameter(f"cannot write to {path!r}: {err.strerror or err}", param_hint=hint) from None
    return folder
