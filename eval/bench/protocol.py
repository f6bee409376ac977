"""The benchmark protocol: what one benchmark declares, and the options every benchmark shares.

A benchmark is one file under `dllm_decode.eval.bench.benchmarks` exporting a `Benchmark` record
(the suite's file exports the suite and each of its sections, all run by the suite): its name, its
command-line options (declared here as plain `Option` records: this package never imports the CLI,
and `dllm-decode bench --help` must not wait for torch, so a record file imports only this module
and loads its machinery inside `run`), the settings `--quick` starts from, `run` (settings -> a
JSON-ready report) and `format` (report -> the printed tables). `dllm-decode bench` builds one
subcommand per record and adds `--quick` and `--json` to each.

The one convention: `run` sends progress lines to `say` (standard error) and returns the report;
`format` returns every table; the command prints `format(report)` and writes the report as JSON.
Settings are the option values the user gave, over `quick` when `--quick` is given; what neither
names takes the benchmark's own default (its `defaults` text lists them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

Say = Callable[[str], None]
Settings = Mapping[str, Any]


@dataclass(frozen=True)
class Option:
    """One command-line option, without click.

    Attributes:
        flags: its names (`--gen-length`; a second name is an alias; `--x/--no-x` a switch).
        dest: the settings key it fills.
        kind: `int`, `float`, `str`, `bool` (a flag or a switch) or a tuple of choices.
        low, high: the bounds of a number (None: unbounded); `low_open`: `low` itself refused.
        multiple: repeatable (the value is a tuple).
        default: None (and () when repeatable): the benchmark's own default.
        registry: a registry kind (`cache`, ...) whose names the value takes as NAME[:K=V,...];
            the help then lists them, read from the registry when it is shown.
    """

    flags: tuple[str, ...]
    dest: str
    kind: Any = int
    help: str = ""
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    multiple: bool = False
    default: Any = None
    metavar: str | None = None
    registry: str = ""

    def but(self, **changes: Any) -> Option:
        return dataclasses.replace(self, **changes)


def count(flag: str, dest: str, help: str = "", **more: Any) -> Option:
    """An integer option >= 1."""
    return Option((flag,), dest, int, help, low=1, **more)


def fraction(flag: str, dest: str, help: str = "", **more: Any) -> Option:
    """A float option in (0, 1] (a confidence threshold)."""
    return Option((flag,), dest, float, help, low=0, high=1, low_open=True, **more)


MODEL = Option(("--model",), "model", str, "The masked diffusion LM: `embedded` (a random-weight "
               "stand-in of its size when it is not installed), `tiny` (random, speed only) or a "
               "model directory.", default="embedded")
THREADS = count("--threads", "threads", "torch intra-op threads (1: stable on a shared machine).", default=1)
REPEATS = count("--repeats", "repeats", "Interleaved repeats; figures are their medians.")
PER_TASK = count("--per-task", "per_task", "Test prompts per task.")
GEN_LENGTH = count("--gen-length", "gen_length", "Canvas length.")
GEN_LENGTHS = count("--gen-length", "gen_lengths", "Canvas length; repeatable.", multiple=True)
NEW_TOKENS = count("--gen-length", "max_new_tokens", "New tokens per prompt.")
SHARED = (MODEL, THREADS, REPEATS, PER_TASK, GEN_LENGTH)
"""The options most benchmarks take, in this order (a benchmark may rename where they land)."""
DEVICE = Option(("--device",), "device", str, "cpu, cuda, cuda:N [cpu].")
DTYPE = Option(("--dtype",), "dtype", ("float32", "bfloat16", "float16"), "Weights and activations.")
KV_CACHE_DTYPE = Option(("--kv-cache-dtype",), "kv_cache_dtype", ("auto", "fp8", "int8"),
                        "How the caches keep K/V (`dllm_decode.quant.kv`) [auto: the model's dtype].")


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: `dllm-decode bench NAME`.

    Attributes:
        help: what it measures (the command's help; its first sentence is the listing's line).
        defaults: its defaults and what `--quick` changes (the help's last paragraph).
        options: its options besides `--quick` and `--json`.
        quick: the settings `--quick` starts from (a seconds-long smoke configuration).
        run: settings, say -> report. Raises `OptionError` for bad settings, before any work.
        format: report -> the text printed.
    """

    name: str
    help: str
    defaults: str
    options: tuple[Option, ...]
    run: Callable[[Settings, Say], dict[str, Any]]
    format: Callable[[dict[str, Any]], str]
    quick: Mapping[str, Any] = field(default_factory=dict)


class OptionError(ValueError):
    """A bad setting, found before any work; `flag` names the option (None: several)."""

    def __init__(self, flag: str | None, message: str):
        super().__init__(message)
        self.flag = flag


@contextlib.contextmanager
def blame(flag: str | None = None) -> Iterator[None]:
    """A `ValueError`/`TypeError` inside becomes an `OptionError` naming `flag` (first line only)."""
    try:
        yield
    except OptionError:
        raise
    except (ValueError, TypeError) as err:
        text = str(err).strip()
        raise OptionError(flag, text.splitlines()[0] if text else type(err).__name__) from None


def fill(options_class: Any, settings: Settings, flag: str | None = None, **extra: Any) -> Any:
    """The benchmark's options record from the settings that name its fields (others ignored);
    a bad value is an `OptionError` (naming `flag` when one option is the likely culprit)."""
    names = {f.name for f in dataclasses.fields(options_class)}
    with blame(flag):
        return options_class(**{k: v for k, v in {**settings, **extra}.items() if k in names})


def later(module: str, name: str) -> Callable[..., Any]:
    """`module.name`, imported at its first call (so a record's file stays light)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)
    call.__name__ = call.__qualname__ = name
    return call
