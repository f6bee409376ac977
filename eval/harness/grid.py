"""The decoding configurations of an evaluation: schedulers x sweeps, each a `Setting`.

Sweep and option keys: a scheduler field (`threshold`, `steps_per_block`, ...); `tokens_per_step`
(schedulers with `steps_per_block`: k tokens per step, i.e. `steps_per_block = ceil(block / k)`,
ParallelBench's top-k axis); `block_length`, `gen_length` (an int or `answer`), `temperature`;
`cache.<field>`. A sweep multiplies only the schedulers it applies to; `--sweep a=.. --sweep b=..`
is the product. The sweep keys stay out of a setting's `group`, so one group is one curve.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dllm_decode.config import DecodeConfig
from dllm_decode.eval.harness.records import stable_hash
from dllm_decode.registry import component, component_dict, registry

TOKENS_PER_STEP = "tokens_per_step"
GLOBAL_KEYS = ("block_length", "gen_length", "temperature")
ANSWER = "answer"
"""`gen_length=answer`: each example's canvas is exactly its reference answer (infilling)."""

Options = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Setting:
    """One decoding configuration (one point of a sweep).

    Attributes:
        scheduler: registered scheduler name; `options` its fields as text, plus
            `tokens_per_step`.
        cache, cache_options: registered cache name and fields.
        filters: (registered filter name, options) in order.
        gen_length: canvas length G, or None for each example's answer length.
        block_length: semi-AR block; None = one block over the canvas (ParallelBench's default).
        temperature, seed: as `DecodeConfig`.
        swept: option keys a sweep varies (left out of `group`).
        self_decoder, self_decoder_options: a registered self-speculative decoder that decodes
            this setting (the scheduler is its base rule), and its fields; `none`: the denoising
            loop. Left out of `to_dict` when `none`, so the keys of loop settings stay as they were.
    """

    scheduler: str
    options: Options = ()
    cache: str = "none"
    cache_options: Options = ()
    filters: tuple[tuple[str, Options], ...] = ()
    gen_length: int | None = 32
    block_length: int | None = None
    temperature: float = 0.0
    seed: int = 0
    swept: tuple[str, ...] = ()
    self_decoder: str = "none"
    self_decoder_options: Options = ()

    def canvas_for(self, length: int, natural: int | None = None) -> int:
        """The canvas a batch of `length` decodes on: `length`, except that an answer-length
        canvas (`gen_length` None) on a model with a `natural` block grid (a block-diffusion
        model's block, a noise model's canvas) is rounded up to whole blocks of it, since such a
        model decodes whole blocks of its grid (or sub-blocks of them); the answer is still
        scored on its own tokens (the rest is decoded as end-of-text)."""
        if self.gen_length is None and natural and length % natural:
            return -(-length // natural) * natural
        return length

    def block_for(self, gen_length: int, natural: int | None = None) -> int:
        """The block length used on a canvas of `gen_length`: when unset, the model's `natural`
        block (a block-diffusion model's own, also on its answer-length canvases, which
        `canvas_for` makes whole blocks) or else the whole canvas. On answer-length canvases
        (`gen_length` None) a block that does not divide an example's canvas is refused by
        `runner.plan` before any decode (the fallback here is the whole canvas); a fixed canvas keeps the value as given, so a bad one fails validation
        instead of being replaced."""
        if self.block_length is None:
            fits = natural and (self.gen_length is not None or gen_length % natural == 0)
            return natural if fits else gen_length
        if self.gen_length is None and (self.block_length > gen_length or gen_length % self.block_length):
            return gen_length
        return self.block_length

    def _scheduler_spec(self, gen_length: int | None = None, natural: int | None = None) -> dict[str, Any]:
        """The scheduler as `component` takes it; `tokens_per_step` becomes `steps_per_block`
        on a known canvas and is left out otherwise."""
        options = dict(self.options)
        k = options.pop(TOKENS_PER_STEP, None)
        if k is not None and gen_length is not None:
            options["steps_per_block"] = str(math.ceil(self.block_for(gen_length, natural) / int(k)))
        return {"name": self.scheduler, **options}

    def decode_config(self, gen_length: int, natural_block: int | None = None) -> DecodeConfig:
        """The one decode record of this setting on a canvas of `gen_length` (`natural_block`:
        the model's own block size, for block-diffusion models)."""
        return DecodeConfig.from_dict({
            "scheduler": self._scheduler_spec(gen_length, natural_block),
            "cache": {"name": self.cache, **dict(self.cache_options)},
            "filters": [{"name": name, **dict(options)} for name, options in self.filters],
            "gen_length": gen_length, "block_length": self.block_for(gen_length, natural_block),
            "temperature": self.temperature, "seed": self.seed})

    def build_self_decoder(self) -> Any:
        """The `SelfDecoder` that decodes this setting, or None for the denoising loop."""
        if self.self_decoder == "none":
            return None
        return component("self_decoder", {"name": self.self_decoder, **dict(self.self_decoder_options)})

    def params(self) -> dict[str, Any]:
        """Options set on the command line or by a sweep, typed (for tables and legends)."""
        built = component("scheduler", self._scheduler_spec())
        out: dict[str, Any] = {}
        for key, value in self.options:
            out[key] = int(value) if key == TOKENS_PER_STEP else getattr(built, key)
        for key in self.swept:
            if key in GLOBAL_KEYS:
                out[key] = getattr(self, key)
            elif key.startswith("cache."):
                out[key] = dict(self.cache_options)[key[len("cache."):]]
        return out

    def to_dict(self) -> dict[str, Any]:
        """Everything that determines the outputs, with every default filled in: the
        `DecodeConfig.to_dict` form, with the grid's canvas fields (`gen_length` may be
        `answer`, `block_length` None means the whole canvas, `tokens_per_step` stands in for
        `steps_per_block`)."""
        scheduler = component_dict(component("scheduler", self._scheduler_spec()))
        if TOKENS_PER_STEP in dict(self.options):
            scheduler[TOKENS_PER_STEP] = int(dict(self.options)[TOKENS_PER_STEP])
            scheduler.pop("steps_per_block", None)
        return {"scheduler": scheduler,
                "cache": component_dict(component("cache", {"name": self.cache, **dict(self.cache_options)})),
                "filters": [component_dict(component("filter", {"name": name, **dict(options)}))
                            for name, options in self.filters],
                "gen_length": self.gen_length if self.gen_length is not None else ANSWER,
                "block_length": self.block_length, "temperature": self.temperature,
                "seed": self.seed, **self._self_decoder_part()}

    def _self_decoder_part(self) -> dict[str, Any]:
        decoder = self.build_self_decoder()
        return {} if decoder is None else {"self_decoder": component_dict(decoder)}

    @property
    def key(self) -> str:
        return stable_hash(self.to_dict())

    @property
    def group(self) -> str:
        """Identity of the curve this setting lies on: the setting minus its swept keys."""
        base = dataclasses.replace(
            self, options=tuple((k, v) for k, v in self.options if k not in self.swept),
            cache_options=tuple((k, v) for k, v in self.cache_options
                                if f"cache.{k}" not in self.swept),
            **{k: None for k in ("gen_length", "block_length") if k in self.swept},
            **({"temperature": -1.0} if "temperature" in self.swept else {}))
        return stable_hash([base.scheduler, base.options, base.cache, base.cache_options,
                            base.filters, base.gen_length, base.block_length, base.temperature,
                            base.seed, self.swept]
                           + ([] if self.self_decoder == "none" else [self.self_decoder, self.self_decoder_options]))

    def label(self) -> str:
        """Short legend text: scheduler plus its fixed (non-swept) options."""
        fixed = [f"{k}={v}" for k, v in self.options if k not in self.swept]
        extra = [] if self.cache == "none" else [f"cache={self.cache}"]
        own = [] if self.self_decoder == "none" else \
            [f"self_decoder={self.self_decoder}", *(f"{k}={v}" for k, v in self.self_decoder_options)]
        return " ".join([self.scheduler, *fixed, *extra, *(name for name, _ in self.filters), *own])


def parse_sweep(text: str) -> tuple[str, list[str]]:
    """`key=v1,v2,...` -> (key, values). Raises ValueError without `=` or values."""
    key, sep, values = text.partition("=")
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not sep or not key.strip() or not items:
        raise ValueError(f"expected KEY=V1,V2,..., got {text!r}")
    return key.strip(), items


def _applies(key: str, scheduler: str) -> bool:
    fields = {f.name for f in dataclasses.fields(registry("scheduler")[scheduler])}
    if key == TOKENS_PER_STEP:
        return "steps_per_block" in fields
    return key.split(".", 1)[0] in fields or key in GLOBAL_KEYS or key.startswith("cache.")


def expand_grid(schedulers: Sequence[tuple[str, Mapping[str, str]]], options: Mapping[str, str],
                sweeps: Sequence[tuple[str, Sequence[str]]], **common: Any) -> list[Setting]:
    """Every setting of the grid, validated (each is built once).

    Args:
        schedulers: (name, its own options) per `--scheduler`.
        options: `-o` options, applied to every scheduler that has the field.
        sweeps: (key, values) per `--sweep`.
        common: `Setting` fields shared by all (cache, filters, gen_length, ...).
    Raises:
        ValueError: unknown scheduler, option or sweep key that applies to no scheduler, a sweep
            key given twice (the later list would silently replace the earlier), a value the
            component rejects.
    """
    for name, _ in schedulers:
        if name not in registry("scheduler"):
            raise ValueError(f"unknown scheduler {name!r}; choose from {sorted(registry('scheduler'))}")
    keys = [k for k, _ in sweeps]
    if repeated := sorted({k for k in keys if keys.count(k) > 1}):
        raise ValueError(f"--sweep {repeated[0]!r} is given more than once; give all its values in one "
                         f"list (sweeps multiply and apply to every scheduler that has the field)")
    for key in [*options, *keys]:
        if not any(_applies(key, name) for name, _ in schedulers):
            raise ValueError(f"option {key!r} applies to none of the schedulers "
                             f"{[n for n, _ in schedulers]}")
    settings = []
    for name, own in schedulers:
        fixed = {k: v for k, v in options.items() if _applies(k, name)} | dict(own)
        mine = [(k, vs) for k, vs in sweeps if _applies(k, name)]
        for values in itertools.product(*(vs for _, vs in mine)):
            chosen = fixed | dict(zip((k for k, _ in mine), values))
            settings.append(_setting(name, chosen, tuple(k for k, _ in mine), common))
    for setting in settings:
        if (k := dict(setting.options).get(TOKENS_PER_STEP)) is not None and (
                not (k.isascii() and k.isdigit()) or int(k) < 1):
            raise ValueError(f"{TOKENS_PER_STEP} must be an integer >= 1, got {k!r}")
        setting.to_dict()                       # builds every component: errors surface now
        if setting.gen_length is not None:
            setting.decode_config(setting.gen_length)
    return list(dict.fromkeys(settings))


def _setting(name: str, chosen: Mapping[str, str], swept: tuple[str, ...],
             common: Mapping[str, Any]) -> Setting:
    fields: dict[str, Any] = dict(common)
    cache_options = dict(fields.pop("cache_options", ()))
    scheduler_options = {}
    for key, value in chosen.items():
        if key.startswith("cache."):
            cache_options[key[len("cache."):]] = value
        elif key == "gen_length":
            fields[key] = None if value == ANSWER else _int(key, value)
        elif key == "block_length":
            fields[key] = None if value.lower() == "none" else _int(key, value)
        elif key == "temperature":
            fields[key] = _number(key, value)
        else:
            scheduler_options[key] = value
    return Setting(scheduler=name, options=tuple(sorted(scheduler_options.items())),
                   cache_options=tuple(sorted(cache_options.items())), swept=swept, **fields)


def _int(key: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise ValueError(f"{key} must be an integer >= 1, got {value!r}")
    return number


def _number(key: str, value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{key} must be a number, got {value!r}") from None


def with_self_decoders(settings: Sequence[Setting], decoders: Sequence[tuple[str, Mapping[str, str]]],
                       options: Mapping[str, str]) -> list[Setting]:
    """Every setting once per self-decoder (`none`: the denoising loop), each built once.

    Args:
        decoders: (name, its own options) per `--self-decoder`.
        options: `-s` options, set on every self-decoder that has the field.
    Raises:
        ValueError: an unknown self-decoder, an option no named self-decoder has, a bad value.
    """
    known = registry("self_decoder")
    for name, _ in decoders:
        if name != "none" and name not in known:
            raise ValueError(f"unknown self_decoder {name!r}; choose from {['none', *known]}")
    has = {name: {f.name for f in dataclasses.fields(known[name])} for name, _ in decoders if name != "none"}
    for key in options:
        if not any(key in fields for fields in has.values()):
            raise ValueError(f"self-decoder option {key!r} applies to none of {[n for n, _ in decoders]}")
    out = []
    for name, own in decoders:
        chosen = {} if name == "none" else {k: v for k, v in options.items() if k in has[name]} | dict(own)
        if name == "none" and own:
            raise ValueError(f"`none` (the denoising loop) takes no self-decoder options, got {sorted(own)}")
        for setting in settings:
            out.append(dataclasses.replace(setting, self_decoder=name,
                                           self_decoder_options=tuple(sorted(chosen.items()))))
    for setting in out:
        setting.build_self_decoder()                 # errors surface now
    return list(dict.fromkeys(out))
