"""What a request's component options may be: registered names and typed values, never files.

A request chooses a scheduler, cache or filter by registered name, or as `{"name": ..., option:
value}`; wrappers take their base the same way (or dotted `base.x` names). `check_options` reads
such a spec before anything is built:

- an option that opens a file (a `fields.file_option` field: the type says so, no list is kept
  by hand) keeps a value the server was started with, or a shipped name it declares: files are
  start-up options, and the answer is the same whether a named file exists;
- no string value looks like a path (`/`, `\\`, a NUL, a leading `~` or `.`, `..`);
- a bool option takes only a JSON boolean, an int option only an integer, a float option only a
  number (the CLI parses its own strings; a request's JSON is already typed);
- wrapping is bounded (`MAX_WRAPS` levels).
"""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from collections.abc import Mapping
from typing import Any

from dllm_decode.fields import free_names, names_file

MAX_WRAPS = 16
"""The deepest chain of wrapped components (`base` of `base` ...) a request may spell."""



class OptionError(ValueError):
    """A component spec a request may not send (`param` names where it is)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


PATH_LIKE = re.compile(r"[/\\\x00]|^~|^\.|\.\.")


def check_options(kinds: tuple[str, ...], spec: Any, started: list[Any], param: str, depth: int = 0) -> None:
    """A request's component spec (a name, or `{"name": ..., option: value}`), checked before
    anything is built: an option that loads a file keeps a value the server started with (or its
    default, a shipped name); no string value looks like a path; a bool option takes only a JSON
    boolean, an int option only an integer, a float option only a number; wrapped components
    (`base`, dotted `base.x` names) get the same check, down to `MAX_WRAPS` levels.

    Raises:
        OptionError: naming the parameter.
    """
    if depth > MAX_WRAPS:
        raise OptionError(f"{param} wraps components deeper than {MAX_WRAPS} levels", param)
    if isinstance(spec, str):
        _no_path(spec, param)
        return
    if spec is None and depth == 0 and not param.startswith("dllm.filters"):
        return                                      # the server's default
    if not isinstance(spec, Mapping):
        shown = "null" if spec is None else json.dumps(spec) if isinstance(spec, (bool, int, float, list)) else repr(spec)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise OptionError(f"{param} must be a registered name or an object with `name`, got {shown}", param)
    name = spec.get("name")
    cls, kind = _entry(kinds, name, started, param)
    if cls is None:
        return                                      # an unknown name: `component` lists the choices
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    nested: dict[str, dict[str, Any]] = {}
    for key, value in spec.items():
        if key == "name":
            continue
        if not isinstance(key, str):
            raise OptionError(f"{param} option names must be strings", param)
        head, _, rest = key.partition(".")
        where = f"{param}.{key}"
        if head not in fields:
            continue                                # `build` names the unknown option
        if rest:
            nested.setdefault(head, {})[rest] = value
            continue
        field = fields[head]
        if names_file(field):
            own = {getattr(c, head) for c in _all(started) if type(c) is cls}
            allowed = set(free_names(field)) | own
            if not isinstance(value, str) or value not in allowed:
                raise OptionError(f"{where} names a file; a request may only use a shipped name or a "
                                  f"value the server was started with ({', '.join(sorted(map(repr, allowed)))}); "
                                  f"files are chosen when the server starts", where)
            if value in own:
                continue                            # the server's own value, a path maybe
        _typed(hints[head], value, where)
        if isinstance(value, (str, Mapping)) and _is_component_type(hints[head]):
            check_options(kinds, value, started, where, depth + 1)
    for head, options in nested.items():
        base = spec.get(head)
        inner = {**(base if isinstance(base, Mapping) else {"name": base} if isinstance(base, str) else
                    {"name": _default_name(fields[head], kinds)}), **options}
        check_options(kinds, inner, started, f"{param}.{head}", depth + 1)


def _entry(kinds: tuple[str, ...], name: Any, started: list[Any], param: str) -> tuple[Any, str]:
    from dllm_decode.registry import registry

    if not isinstance(name, str):
        return None, ""
    _no_path(name, f"{param}.name")
    for kind in kinds:
        if name in registry(kind):
            return registry(kind)[name], kind
    return None, ""


def _default_name(field: Any, kinds: tuple[str, ...]) -> str | None:
    from dllm_decode.registry import name_of

    default = field.default if field.default is not dataclasses.MISSING else (
        field.default_factory() if field.default_factory is not dataclasses.MISSING else None)
    return name_of(default) if default is not None else None


def _all(components: list[Any]) -> list[Any]:
    """The components and every component they wrap."""
    out, stack = [], list(components)
    while stack:
        item = stack.pop()
        if dataclasses.is_dataclass(item) and not isinstance(item, type):
            out.append(item)
            stack.extend(getattr(item, f.name) for f in dataclasses.fields(item))
    return out


def _no_path(value: str, where: str) -> None:
    if PATH_LIKE.search(value):
        raise OptionError(f"{where}={value!r} looks like a file path; per-request options name "
                          f"registered components and values, never files", where)


def _is_component_type(annotation: Any) -> bool:
    return any(isinstance(c, type) and hasattr(c, "select") for c in (annotation, *typing.get_args(annotation)))


def _typed(annotation: Any, value: Any, where: str) -> None:
    """JSON values of a component option must have the option's type (no "true" for a bool)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    plain = args[0] if len(args) == 1 and typing.get_origin(annotation) is not tuple else annotation
    if value is None and type(None) in typing.get_args(annotation):
        return
    if isinstance(value, str):
        _no_path(value, where)
    if plain is bool and not isinstance(value, bool):
        raise OptionError(f"{where} must be true or false, got {value!r}", where)
    if plain is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise OptionError(f"{where} must be an integer, got {value!r}", where)
    if plain is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise OptionError(f"{where} must be a number, got {value!r}", where)
    if typing.get_origin(plain) is tuple:
        # a JSON list of the declared items: text ("1,2", Unicode digits) is the CLI's spelling
        inner = typing.get_args(plain)[0]
        if not isinstance(value, list):
            raise OptionError(f"{where} must be a JSON list of {getattr(inner, '__name__', inner)}, "
                              f"got {value!r}", where)
        for item in value:
            if inner in (int, float, bool, str) or typing.get_origin(inner) is tuple:
                _typed(inner, item, f"{where}[]")
            elif isinstance(item, str):
                _no_path(item, where)
