"""The attention back ends of the plain-torch models, a model option (`load_model(attention=)`,
`--attention`): `dense` (SDPA over every allowed key) or `sparsed` (`models.sparsed`).

A back end declares the families it runs on (`problem(model)`) and the caches it runs under
(`caches`, None: any); `set_attention` refuses another family at load, `attention_refusal`
another cache wherever a decode is checked. Its per-request state (`new_state`) rides in the
forward's `kv` argument, which the `none` cache passes (`interfaces.NoCache`).
"""

from __future__ import annotations

from typing import Any

from dllm_decode.models.sparsed import DenseAttention, SparseD

ATTENTION = {
    "dense": DenseAttention,
    "sparsed": SparseD,
}


def backend_of(model: Any) -> Any:
    """The model's attention back end (`DenseAttention()` when none was set)."""
    return getattr(model, "attention_backend", None) or DenseAttention()


def set_attention(model: Any, spec: Any) -> Any:
    """Give `model` the attention back end `spec` (a name, a `{"name": ..., option: value}`
    mapping, `NAME:key=value,...` text or a back end object); returns the model.

    Raises:
        ValueError: an unknown back end or option, or a model the back end does not cover.
    """
    backend = parse_attention(spec)
    if (problem := backend.problem(model)) is not None:
        raise ValueError(f"attention {_name(backend)!r} does not run on this model ({problem}); "
                         f"it runs on {backend.families}")
    model.attention_backend = None if isinstance(backend, DenseAttention) else backend
    return model


def parse_attention(spec: Any) -> Any:
    """A back end object from a name, `NAME:key=value,...` text, a mapping or an object.

    Raises:
        ValueError: an unknown back end or option, or an option out of range (one line).
    """
    from dllm_decode.option_text import parse_options
    from dllm_decode.registry import component

    if isinstance(spec, str):
        name, _, rest = spec.partition(":")
        try:
            spec = {"name": name.strip(), **dict(parse_options(rest))}
        except ValueError as err:
            raise ValueError(f"attention {err}") from None
    return component("attention", spec)


def attention_state(model: Any) -> Any:
    """A fresh per-request state of the model's back end (None for dense attention)."""
    return backend_of(model).new_state(model)


def attention_refusal(model: Any, cache: Any) -> str | None:
    """Why the model's attention back end refuses `cache` (one line), or None."""
    backend = backend_of(model)
    if backend.caches is None or _name(cache) in backend.caches:
        return None
    return (f"attention {_name(backend)!r} runs only under the caches {list(backend.caches)}, "
            f"not {_name(cache)!r}; use one of those or attention 'dense'")


def _name(part: Any) -> str:
    from dllm_decode.registry import name_of

    return name_of(part)


def consult_refusal(model: Any, scheduler: Any) -> str | None:
    """Why the model's attention back end refuses `scheduler` (one line), or None: a rule whose
    look-ahead or guide forwards call the model outside the cache would run them without the
    back end's per-request state, i.e. silently dense."""
    backend = backend_of(model)
    if attention_state(model) is None:
        return None
    if getattr(scheduler, "lookahead_candidates", 0) or getattr(scheduler, "guide", None) is not None:
        return (f"attention {_name(backend)!r} keeps per-request state that the extra forwards of "
                f"scheduler {_name(scheduler)!r} (look-ahead or guide) do not carry; use attention "
                f"'dense' or another scheduler")
    return None
