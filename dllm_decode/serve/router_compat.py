"""What a load balancer in front of N servers sends and probes: vllm-router and sglang-router.

Both routers re-serialise every body and add SGLang/vLLM extension fields to it (completions:
`no_stop_trim, ignore_eos, skip_special_tokens, return_hidden_states`; chat also
`continue_final_message, separate_reasoning, stream_reasoning, include_reasoning`). A server that
refuses unknown fields would refuse every routed request, so `FIELDS` lists each one with the
values this server honours: a value that means what this server does anyway is accepted and
ignored; a value it cannot honour is a 400 naming the field (never silently ignored).

Probes answered (routes in `dllm_decode.serve.probes`, answers here): `GET /get_model_info` and `/model_info` (sglang-router asks at
registration), `GET /get_server_info` and `/server_info`, `POST /tokenize` (vllm-router asks for
token-level prefix routing; a 404 there only makes it route on text). `/health` (both routers
poll it until it answers 200) is the server's own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RouterField:
    """A field a router adds to a request body.

    Attributes:
        endpoints: the request kinds it is accepted on (`completion`, `chat`).
        accepts: True for the values this server honours.
        honoured: the accepted values, in words (the 400 message and the docs say them).
        meaning: what the accepted value means here.
    """

    endpoints: frozenset[str]
    accepts: Callable[[Any], bool]
    honoured: str
    meaning: str


_BOTH = frozenset({"completion", "chat"})
_CHAT = frozenset({"chat"})


def _is(*values: Any) -> Callable[[Any], bool]:
    return lambda v: v is None or any(v is value for value in values)


FIELDS: dict[str, RouterField] = {
    "ignore_eos": RouterField(_BOTH, _is(False), "false",
                              "an answer ends at the first end-of-text token (the engine's rule)"),
    "no_stop_trim": RouterField(_BOTH, _is(False), "false",
                                "the answer is cut before a stop string, which is not returned"),
    "skip_special_tokens": RouterField(_BOTH, _is(True), "true",
                                       "answer text never holds special tokens"),
    "return_hidden_states": RouterField(_BOTH, _is(False), "false", "no hidden states are returned"),
    "continue_final_message": RouterField(_CHAT, _is(False), "false",
                                          "the reply is a new assistant turn"),
    "separate_reasoning": RouterField(_CHAT, _is(True, False), "true or false",
                                      "ignored: this server has no reasoning parser; all text is content"),
    "stream_reasoning": RouterField(_CHAT, _is(True, False), "true or false",
                                    "ignored: this server has no reasoning parser"),
    "include_reasoning": RouterField(_CHAT, _is(True, False), "true or false",
                                     "ignored: this server has no reasoning parser"),
}
"""Router extension fields: name -> what this server accepts and what it means."""


def keys(kind: str) -> set[str]:
    """The router fields a request of `kind` may carry."""
    return {name for name, spec in FIELDS.items() if kind in spec.endpoints}


@dataclass(frozen=True)
class Refusal:
    """A router field set to a value this server cannot honour."""

    param: str
    message: str


def refusal(kind: str, body: Mapping[str, Any]) -> Refusal | None:
    """The first router field of `body` at a value this server cannot honour, or None."""
    for name, spec in FIELDS.items():
        if kind in spec.endpoints and name in body and not spec.accepts(body[name]):
            return Refusal(name, f"{name}={body[name]!r} is not supported by this server "
                                 f"(accepted: {spec.honoured}; {spec.meaning})")
    return None


def model_info(state: Any) -> dict[str, Any]:
    """`/get_model_info`: the served model's name, as SGLang reports it."""
    engine = state.worker.engine
    return {"model_path": state.settings.model_id, "tokenizer_path": state.settings.model_id,
            "is_generation": True, "max_batch_size": engine.max_batch_size,
            "max_tokens": state.settings.max_tokens}


TOKENIZE_KEYS = frozenset({"prompt", "add_special_tokens", "model"})


def tokenize(state: Any, body: Any) -> dict[str, Any]:
    """`/tokenize` (vLLM's shape): `{"prompt": text}` -> `{"tokens", "count", "max_model_len"}`
    (`add_special_tokens` as the request says; false by default, as the server encodes prompts).

    Raises:
        ValueError: a body that is not `{"prompt": str, ...}`, or a model without a tokenizer.
    """
    if not isinstance(body, Mapping) or not isinstance(body.get("prompt"), str):
        raise ValueError("the body must be an object with a string `prompt`")
    if unknown := sorted(set(body) - TOKENIZE_KEYS, key=str):
        raise ValueError(f"unknown key {str(unknown[0])[:80]!r}; /tokenize takes {', '.join(sorted(TOKENIZE_KEYS))}")
    model, settings = body.get("model"), state.settings
    served = {settings.model_id, *(f"{settings.model_id}:{tag}" for tag in (*settings.adapters, *settings.presets))}
    if model is not None and (not isinstance(model, str) or model not in served):          # as /v1/completions: never ignored
        shown = repr(model)[:80]
        raise ValueError(f"the model {shown} is not served here; this server serves {settings.model_id!r}")
    if state.tokenizer is None:
        raise ValueError("this model has no tokenizer")
    special = body.get("add_special_tokens", False)
    if not isinstance(special, bool):
        raise ValueError(f"add_special_tokens must be true or false, got {special!r}")
    ids = list(state.tokenizer(body["prompt"], add_special_tokens=special)["input_ids"])
    length = getattr(state.worker.engine.model, "max_length", None)
    return {"tokens": ids, "count": len(ids), "max_model_len": length}
