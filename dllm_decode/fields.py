"""One type check for every frozen-dataclass record: each field's value against its annotation.

`Checked` is a mixin of the component base classes (`Scheduler`, `Cache`, `Filter`, `Drafter`):
its `__init_subclass__` wraps each subclass's `__post_init__`, so every registered component gets
the same check without a line of its own. Records that are not components (`DecodeConfig`,
`SpecConfig`, `Sampling`) call `check_types` / `check_finite` from their `__post_init__`.

The rules, for fields annotated with plain types (optionally `| None`, or `tuple[T, ...]`):
  * `int` refuses bools, floats and text;
  * `float` refuses bools and non-numbers, and (after the class's own range checks, so their
    messages stay) NaN, infinity unless the class lists the field in `infinite_ok`, and finite
    values beyond +-`FLOAT_MOST`;
  * `bool` refuses anything but `True`/`False`;
  * `str` refuses anything but text.
Fields of any other annotation (components, tensors, callables) are left to the class.
The message names the class, the field, the value and what is accepted.

Two markers on a field's metadata, read by this module and by the server's request check
(`serve/options.py`), so no list of special options is kept by hand:
  * `file_option(default, names=...)`: the field names a file (weights, a table, a model). The
    listed `names` (and the default) are shipped resources that need no file; any other value
    is a start-up option: a server request may only repeat a value the server started with;
  * `bounded(default, most=N, scales=...)`: a count that scales a step's work or memory; a value
    above `most` is refused here, at construction, wherever the component comes from.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import typing
from typing import Any, ClassVar

_SIMPLE = (bool, int, float, str)
_HINTS: dict[type, dict[str, tuple[str, type, bool]]] = {}


def _kinds(cls: type) -> dict[str, tuple[str, type, bool]]:
    """field -> (shape "one"|"tuple", base type, optional) for fields of checkable annotation."""
    if cls in _HINTS:
        return _HINTS[cls]
    try:
        hints = typing.get_type_hints(cls)
    except Exception:                                    # an unresolvable forward reference
        hints = {}
        for f in dataclasses.fields(cls):
            if isinstance(f.type, str):
                try:
                    hints[f.name] = eval(f.type, {"__builtins__": {}}, {t.__name__: t for t in (*_SIMPLE, tuple)})  # noqa: S307
                except Exception:
                    continue
            else:
                hints[f.name] = f.type
    out: dict[str, tuple[str, type, bool]] = {}
    for f in dataclasses.fields(cls):
        annotation = hints.get(f.name)
        if annotation is None:
            continue
        shape, optional = "one", False
        args = typing.get_args(annotation)
        if typing.get_origin(annotation) is tuple:
            if len(args) == 2 and args[1] is Ellipsis and args[0] in _SIMPLE:
                out[f.name] = ("tuple", args[0], False)
            continue
        if args and type(None) in args:                  # `T | None`
            rest = [a for a in args if a is not type(None)]
            if len(rest) != 1:
                continue
            annotation, optional = rest[0], True
        if annotation in _SIMPLE:
            out[f.name] = (shape, annotation, optional)
    _HINTS[cls] = out
    return out


MAX_CANVAS = 1 << 20
"""The longest canvas any count may name (a generation length, a window, a radius, steps per
block): far past any model's context, and small enough that a tensor of it never stalls a step."""
FLOAT_MOST = 1e18
"""The largest magnitude of a finite float option: a step computes in float32 (largest finite
value 3.4e38), and the product of two such magnitudes still fits, so an option can never turn a
step's scores into infinities (which stalls the block instead of failing in one line)."""
FILE_OPTION = "loads_file"
"""Field metadata key: the field names a file (see `file_option`)."""
FREE_NAMES = "file_free_names"
"""Field metadata key: the values of a file option that open no user file (shipped names)."""
MOST = "most"
"""Field metadata key: the largest value of a bounded count (see `bounded`)."""
SCALES = "scales"
"""Field metadata key: what a bounded count scales (`rows`: forward rows per step; `work`,
`memory`)."""


def file_option(default: str, *, names: tuple[str, ...] = ()) -> Any:
    """A component field that names a file (or one of the shipped `names`, which need none).

    Files are start-up options: the server lets a request use only the default, a shipped name,
    or a value the server was started with."""
    return dataclasses.field(default=default, metadata={FILE_OPTION: True, FREE_NAMES: (default, *names)})


def bounded(default: Any, *, most: int, scales: str = "work") -> Any:
    """A numeric component field with an upper bound `most` (checked at construction)."""
    return dataclasses.field(default=default, metadata={MOST: most, SCALES: scales})


def names_file(field: dataclasses.Field) -> bool:
    """Whether a dataclass field is a `file_option`."""
    return bool(field.metadata.get(FILE_OPTION))


def free_names(field: dataclasses.Field) -> tuple[str, ...]:
    """The values of a `file_option` field that open no user file."""
    return tuple(field.metadata.get(FREE_NAMES, ()))


def scaling_fields(cls: type, scales: str | None = None) -> dict[str, int]:
    """field -> bound of the `bounded` fields of a dataclass (those scaling `scales`, if given)."""
    if not dataclasses.is_dataclass(cls):
        return {}
    return {f.name: f.metadata[MOST] for f in dataclasses.fields(cls)
            if MOST in f.metadata and (scales is None or f.metadata.get(SCALES) == scales)}


def check_probability(obj: Any, *names: str, infinite_ok: bool = False) -> None:
    """Raise ValueError unless each named float field lies in [0, 1] (or is +inf, meaning "never",
    when `infinite_ok`): a finite bar above 1 silently means the same as inf."""
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            continue                                  # `check_types` words it
        if not (0.0 <= value <= 1.0 or (infinite_ok and value == math.inf)):
            accepted = "[0, 1] or inf (never)" if infinite_ok else "[0, 1]"
            raise ValueError(f"{_label(obj, name)} is a probability bar: it must be in {accepted}, got {value}")


def check_order(obj: Any, low: str, high: str) -> None:
    """Raise ValueError unless field `low` <= field `high` (ordered thresholds)."""
    a, b = getattr(obj, low), getattr(obj, high)
    if isinstance(a, numbers.Real) and isinstance(b, numbers.Real) and not a <= b:
        raise ValueError(f"{_label(obj, low)} ({a}) must be <= {high} ({b})")


_ACCEPTED = {bool: "a boolean (true/false)", int: "an integer", float: "a number", str: "text"}


INT64_LIMIT = 2 ** 63


def _wrong_type(kind: type, value: Any) -> bool:
    if kind is bool:
        return not isinstance(value, bool)
    if kind is int:
        return isinstance(value, bool) or not isinstance(value, numbers.Integral)
    if kind is float:
        return isinstance(value, bool) or not isinstance(value, numbers.Real)
    return not isinstance(value, str)


def _label(obj: Any, name: str) -> str:
    return f"{type(obj).__name__}.{name}"


def check_types(obj: Any, only: tuple[str, ...] | None = None) -> None:
    """Raise TypeError naming the class, field, value and accepted type for a field whose value
    is not of its annotated plain type (`only`: check just these fields)."""
    if not dataclasses.is_dataclass(obj):
        return
    for name, (shape, kind, optional) in _kinds(type(obj)).items():
        if only is not None and name not in only:
            continue
        value = getattr(obj, name)
        if value is None and optional:
            continue
        accepted = _ACCEPTED[kind] + (" or None" if optional else "")
        if shape == "tuple":
            if not isinstance(value, tuple):
                raise TypeError(f"{_label(obj, name)} must be a tuple of {_ACCEPTED[kind].split(' ', 1)[1]}s, "
                                f"got {type(value).__name__} {value!r}")
            for item in value:
                if _wrong_type(kind, item):
                    raise TypeError(f"{_label(obj, name)} must hold only {_ACCEPTED[kind].split(' ', 1)[1]}s, "
                                    f"got {type(item).__name__} {item!r} in {value!r}")
        elif _wrong_type(kind, value):
            raise TypeError(f"{_label(obj, name)} must be {accepted}, got {type(value).__name__} {value!r}")
        most = _bounds(type(obj)).get(name)
        for item in (value if shape == "tuple" else (value,)):
            # Counts reach torch as int64: a larger one would overflow deep inside a step.
            if kind is int and item is not None and not -INT64_LIMIT < item < INT64_LIMIT:
                raise ValueError(f"{_label(obj, name)} must lie within +-(2**63 - 1), got {item}")
            if most is not None and item is not None and item > most:
                raise ValueError(f"{_label(obj, name)} must be <= {most} (it scales each step's "
                                 f"{_scales(type(obj), name)}), got {item}")
    for name in _files(type(obj)):
        value = getattr(obj, name)
        if not isinstance(value, str):
            raise TypeError(f"{_label(obj, name)} names a file or a shipped resource: it must be "
                            f"text, got {type(value).__name__} {value!r}")
        if "\x00" in value:
            raise ValueError(f"{_label(obj, name)} must not hold a NUL character, got {value!r}")


def _bounds(cls: type) -> dict[str, int]:
    return scaling_fields(cls)


def _scales(cls: type, name: str) -> str:
    return next(f.metadata.get(SCALES, "work") for f in dataclasses.fields(cls) if f.name == name)


def _files(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if names_file(f))


def check_finite(obj: Any, infinite_ok: tuple[str, ...] = (), only: tuple[str, ...] | None = None) -> None:
    """Raise ValueError for a float field holding NaN, or infinity unless the field is listed
    in `infinite_ok` (or the class's `infinite_ok`)."""
    if not dataclasses.is_dataclass(obj):
        return
    infinite_ok = (*infinite_ok, *getattr(obj, "infinite_ok", ()))
    for name, (shape, kind, _optional) in _kinds(type(obj)).items():
        if kind is not float or (only is not None and name not in only):
            continue
        value = getattr(obj, name)
        for item in (value if shape == "tuple" else (value,)):
            if item is None or isinstance(item, bool) or not isinstance(item, numbers.Real):
                continue
            if math.isnan(item):
                raise ValueError(f"{_label(obj, name)} must be a number, got nan")
            if math.isinf(item) and name not in infinite_ok:
                raise ValueError(f"{_label(obj, name)} must be finite, got {item}")
            if math.isfinite(item) and abs(item) > FLOAT_MOST:
                raise ValueError(f"{_label(obj, name)} must lie within +-{FLOAT_MOST:g}, got {item:g}")


class Checked:
    """Mixin: every dataclass subclass checks its fields' types before its own `__post_init__`
    and their finiteness after it (see the module docstring). A subclass whose float field may
    be infinite lists it in `infinite_ok`."""

    infinite_ok: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("__post_init__")
        if own is None:
            inherited = getattr(cls, "__post_init__", None)
            own = getattr(inherited, "__wrapped__", inherited)
        else:
            own = getattr(own, "__wrapped__", own)

        def __post_init__(self: Any) -> None:
            check_types(self)
            if own is not None:
                own(self)
            check_finite(self)

        __post_init__.__wrapped__ = own  # type: ignore[attr-defined]
        __post_init__.__qualname__ = f"{cls.__qualname__}.__post_init__"
        cls.__post_init__ = __post_init__  # type: ignore[attr-defined]
