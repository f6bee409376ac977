"""Names to objects, at the edges (CLI, eval configs): `build(REGISTRY, name, options)`.

A registry is a dict literal `name -> frozen dataclass` in each plugin package. The dataclass is
its own schema: options are its field names, parsed into the field's declared type. A field
typed as a component (e.g. a wrapper's `base: Scheduler`) takes a registry name, and dotted
options configure it: `-o base=local_leap -o base.kappa=0.8`.

Serialised components (`component_dict`, `component`) name their registry entry. The registries
live in the plugin packages; core finds them by the package names in `HOMES`, at first use, the
way a plugin system discovers plugins, so that no core module depends on a plugin module.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")

HOMES: dict[str, tuple[str, str]] = {
    "scheduler": ("dllm_decode.schedulers", "SCHEDULERS"),
    "cache": ("dllm_decode.caches", "CACHES"),
    "filter": ("dllm_decode.filters", "FILTERS"),
    "draft_length": ("dllm_decode.speculative.draft_lengths", "DRAFT_LENGTHS"),
    "drafter": ("dllm_decode.speculative.drafters", "DRAFTERS"),
    "self_decoder": ("dllm_decode.speculative.self_decoders", "SELF_DECODERS"),
    "attention": ("dllm_decode.models.attention", "ATTENTION"),
}
"""Kind of component -> (package, registry attribute). `draft_length` holds the AR-only rules;
`drafter` the speculative drafters (each entry builds its drafter for a target); `self_decoder`
the self-speculative decoders of diffusion models; `attention` the plain-torch models' attention
back ends (a model option)."""


def registry(kind: str) -> Mapping[str, type]:
    """The registry of one kind of component (`scheduler`, `cache`, `filter`, `draft_length`,
    `drafter`, `self_decoder`, `attention`)."""
    if kind not in HOMES:
        raise ValueError(f"unknown kind of component {kind!r}; choose from {sorted(HOMES)}")
    module, attribute = HOMES[kind]
    return getattr(importlib.import_module(module), attribute)


def names(kind: str) -> tuple[str, ...]:
    """The registered names of one kind of component, in registry order, without importing the
    plugin package when it is not imported yet: the keys of the registry's dict literal, read
    from the package's `__init__.py` source. Help texts use this, so `dllm-decode --help` lists
    every name without waiting for torch; `tests/test_cli.py` checks it equals `registry(kind)`.
    Falls back to the live registry when the source cannot be read that way (a zipped install,
    a registry that is not one dict literal)."""
    import ast
    import sys
    from pathlib import Path

    if kind not in HOMES:
        raise ValueError(f"unknown kind of component {kind!r}; choose from {sorted(HOMES)}")
    module, attribute = HOMES[kind]
    if module not in sys.modules:
        try:
            origin = _source_file(module)
            tree = ast.parse(Path(origin).read_text(encoding="utf-8")) if origin else None
        except (ImportError, OSError, SyntaxError, ValueError):
            tree = None
        for node in ast.walk(tree) if tree is not None else ():
            target = node.target if isinstance(node, ast.AnnAssign) else (
                node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
            if (isinstance(target, ast.Name) and target.id == attribute
                    and isinstance(node.value, ast.Dict)
                    and all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in node.value.keys)):
                return tuple(k.value for k in node.value.keys)  # type: ignore[union-attr]
    return tuple(registry(kind))


def _source_file(module: str) -> str | None:
    """The source file of a module, found without importing it or its parent packages (past the
    first one that is not imported yet, `importlib.util.find_spec` would import them)."""
    import importlib.machinery
    import importlib.util
    import sys

    parts = module.split(".")
    done = 1
    while done < len(parts) and ".".join(parts[:done + 1]) in sys.modules:
        done += 1
    spec = importlib.util.find_spec(".".join(parts[:done + 1]))
    for index in range(done + 1, len(parts)):
        if spec is None or not spec.submodule_search_locations:
            return None
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[:index + 1]),
                                                        list(spec.submodule_search_locations))
    return spec.origin if spec is not None else None


def name_of(obj: Any) -> str:
    """The registry name of a component's class; its class name when it is not registered."""
    for kind in HOMES:
        for key, cls in registry(kind).items():
            if type(obj) is cls:
                return key
    return type(obj).__name__


def component_dict(obj: Any) -> dict[str, Any]:
    """A frozen-dataclass component as `{"name": registry name, field: value, ...}`, nested
    components (a wrapper's `base`) as nested dicts: the form `component` reads back."""
    out: dict[str, Any] = {"name": name_of(obj)}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        out[f.name] = component_dict(value) if dataclasses.is_dataclass(value) else value
    return out


def component(kind: str, spec: Any) -> Any:
    """A component from a registry name, a `{"name": ..., field: value}` mapping (values typed or
    as text, dotted keys for nested components), or an already built object (returned as is).

    Raises:
        ValueError: unknown name or option, a value that does not parse or is out of range; the
            message names the kind.
    """
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, Mapping):
        if not dataclasses.is_dataclass(spec) or isinstance(spec, type):
            raise TypeError(f"a {kind} must be a registry name, a mapping with 'name' or a {kind} "
                            f"object, got {type(spec).__name__} {spec!r}")
        return spec
    options = dict(spec)
    name = options.pop("name", None)
    entries = registry(kind)
    if name not in entries:
        raise ValueError(f"unknown {kind} {name!r}; choose from {sorted(entries)}")
    try:
        return build(entries, name, options)
    except ValueError as err:
        raise ValueError(f"{kind} {err}") from None


def build(entries: Mapping[str, type[T]], name: str, options: Mapping[str, Any] | None = None) -> T:
    """Instantiate `registry[name]` with string (or already typed) option values.

    Raises:
        ValueError: unknown name (lists the choices), unknown option (lists the fields), a value
            that does not parse, or one the class's own validation rejects.
    """
    options = dict(options or {})
    if name not in entries:
        raise ValueError(f"unknown name {name!r}; choose from {sorted(entries)}")
    cls = entries[name]
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    nested: dict[str, dict[str, Any]] = {}
    plain: dict[str, Any] = {}
    for key, value in options.items():
        head, _, rest = key.partition(".")
        if head not in fields:
            raise ValueError(f"{name}: unknown option {head!r}; valid: {sorted(fields)}")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            plain[head] = value
    kwargs: dict[str, Any] = {}
    for key in plain.keys() | nested.keys():
        annotation = hints[key]
        if _is_component(annotation):
            kwargs[key] = _component(entries, cls, key, plain.get(key), nested.get(key, {}))
        elif key in nested:
            raise ValueError(f"{name}: option {key!r} is not a component; drop the dotted part")
        else:
            try:
                kwargs[key] = coerce(annotation, plain[key])
            except ValueError as err:
                raise ValueError(f"{name}: option {key}={plain[key]!r}: {err}") from None
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{name}: {err}") from None


def _component(registry: Mapping[str, type[T]], cls: type, key: str, value: Any,
               nested: dict[str, Any]) -> Any:
    """A component field's value from a registry name, a `component_dict` mapping (JSON round
    trip), an object, or nothing (the field's default, so `-o base.kappa=0.8` keeps the default
    base's other settings); dotted `nested` options then override its fields."""
    if isinstance(value, str):
        return build(registry, value, nested)
    if isinstance(value, Mapping):
        options = dict(value)
        return build(registry, str(options.pop("name", "")), {**options, **nested})
    if value is None:
        spec = next(f for f in dataclasses.fields(cls) if f.name == key)
        value = spec.default if spec.default is not dataclasses.MISSING else spec.default_factory()  # type: ignore[misc]
    if not nested:
        return value
    current = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return build(registry, _name_of(registry, value), {**current, **nested})


def coerce(annotation: Any, value: Any) -> Any:
    """Parse CLI text into a field's declared type (bool/int/float/str/tuple, optionally `| None`);
    a JSON list becomes the tuple a tuple field declares."""
    if typing.get_origin(annotation) is tuple and isinstance(value, list):
        inner = typing.get_args(annotation)[0]
        return tuple(coerce(inner, item) for item in value)
    if not isinstance(value, str):
        return value
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is tuple:
        inner = typing.get_args(annotation)[0]
        return tuple(coerce(inner, part.strip()) for part in value.split(",") if part.strip())
    if args and typing.get_origin(annotation) is not tuple:     # `T | None`
        if value.lower() == "none":
            return None
        if len(args) == 1:
            annotation = args[0]
    if annotation is bool:                     # bool("False") is True, so never call bool(text)
        if value.lower() not in {"true", "false", "1", "0"}:
            raise ValueError(f"expected a boolean (true/false), got {value!r}")
        return value.lower() in {"true", "1"}
    if annotation in (int, float) and not value.isascii():
        # int("\uff11\uff12") is 12: a number is written in ASCII digits, as everywhere else
        raise ValueError(f"expected {annotation.__name__} in ASCII digits, got {value!r}")
    if annotation in (int, float, str):
        try:
            return annotation(value)
        except ValueError:
            raise ValueError(f"expected {annotation.__name__}, got {value!r}") from None
    return value


def _is_component(annotation: Any) -> bool:
    """A field typed as a plugin interface (an abstract class such as `Scheduler` or a
    drafter's `DraftSpec`) takes a registry name and dotted options."""
    candidates = [annotation, *typing.get_args(annotation)]
    return any(isinstance(c, type) and not dataclasses.is_dataclass(c) and inspect.isabstract(c)
               for c in candidates)


def _name_of(registry: Mapping[str, type], obj: Any) -> str:
    for key, cls in registry.items():
        if type(obj) is cls:
            return key
    raise ValueError(f"cannot name component {obj!r}")


def describe(registry: Mapping[str, type]) -> list[tuple[str, str, list[tuple[str, str, Any]]]]:
    """(name, first docstring line, [(field, type, default)]) per entry, for `dllm-decode list`."""
    rows = []
    for key in sorted(registry):
        cls = registry[key]
        hints = typing.get_type_hints(cls)
        doc = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
        params = []
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
            if dataclasses.is_dataclass(default):
                default = _name_of(registry, default) if type(default) in registry.values() else type(default).__name__
            kind = _type_name(hints[f.name])
            if "most" in f.metadata:                      # `fields.bounded`: the type's bound
                kind += f" <= {f.metadata['most']}"
            if f.metadata.get("loads_file"):              # `fields.file_option`: a start-up option
                kind += ", a file (start-up only)"
            params.append((f.name, kind, default))
        rows.append((key, doc, params))
    return rows


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", str(annotation).replace("typing.", ""))
