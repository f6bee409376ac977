"""The OpenAI-compatible request and response bodies (no web framework; shapes and types are
checked with the pydantic models of `schema`).

A request body becomes a `Job` (prompt tokens, the decode record, limits, stream flags) or an
`APIError` whose `body()` is OpenAI's error JSON. dLLM knobs travel in one namespaced object,
`"dllm": {"scheduler", "cache", "filters", "gen_length", "block_length", "stop_at_eos", "preset"}`,
over the server's default record, or over a preset the server was started with (`preset`, or the
model name `MODEL_ID:PRESET`: a task tag choosing a tuned preset); `temperature` and `seed` are the OpenAI fields. Unknown keys and
OpenAI features this server does not implement (n > 1, logprobs, penalties, ...) are refused
with a 400 naming the parameter, never ignored.

What a request may contain is data, never a place: per-request component options choose among
registered names and typed values, never files (`dllm_decode.serve.options`). JSON nesting is
bounded (`MAX_DEPTH`). Prompt text gets the package's one prompt check
(`dllm_decode.prompts`): no lone surrogates, no special tokens written out; words the tokenizer
does not know become a `warning` in the reply.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dllm_decode.cost import OverBudget, check_budget
from dllm_decode.config import DecodeConfig
from dllm_decode.engine import Output
from dllm_decode.fields import check_types
from dllm_decode.models.checkpoint import first_line
from dllm_decode.prompts import check_text, check_token_ids, chat_prompt, render_chat, unknown_words_warning
from dllm_decode.registry import component, component_dict, registry
from dllm_decode.serve import router_compat
from dllm_decode.serve.options import OptionError, check_options

DLLM_KEYS = ("scheduler", "cache", "filters", "gen_length", "block_length", "stop_at_eos", "preset",
             "stream_mode")
"""Keys of the `dllm` extension object."""

_COMMON = {"model", "max_tokens", "temperature", "top_p", "n", "stop", "seed", "stream",
           "stream_options", "user", "presence_penalty", "frequency_penalty", "logit_bias",
           "logprobs", "dllm"}
KEYS = {"completion": _COMMON | {"prompt", "echo", "best_of", "suffix"} | router_compat.keys("completion"),
        "chat": _COMMON | {"messages", "max_completion_tokens", "top_logprobs"} | router_compat.keys("chat")}
"""Accepted top-level keys per endpoint (load balancers' extension fields included)."""

UNSUPPORTED: dict[str, Callable[[Any], bool]] = {
    "n": lambda v: v in (None, 1), "best_of": lambda v: v in (None, 1),
    "top_p": lambda v: v is None or (isinstance(v, (int, float)) and v == 1),
    "presence_penalty": lambda v: v in (None, 0), "frequency_penalty": lambda v: v in (None, 0),
    "logit_bias": lambda v: not v, "logprobs": lambda v: v in (None, False),
    "top_logprobs": lambda v: v in (None, 0), "echo": lambda v: v in (None, False),
    "suffix": lambda v: not v,
}
"""OpenAI parameters accepted only at their neutral value (the check says which values pass)."""

MAX_STOPS = 4
MAX_STOP_CHARS = 256
"""The longest stop string (the stream holds back text that may begin one, per update)."""
MAX_DEPTH = 16
"""The deepest JSON nesting a request may have (objects and lists; an OpenAI chat body needs 5,
a wrapped scheduler one more per wrapper); deeper is a 400."""


class APIError(Exception):
    """An error reply: HTTP status and OpenAI's `{"error": {message, type, param, code}}`."""

    TYPES = {400: "invalid_request_error", 404: "not_found_error", 405: "invalid_request_error",
             408: "invalid_request_error", 413: "invalid_request_error", 422: "invalid_request_error",
             429: "rate_limit_error", 500: "server_error", 503: "service_unavailable", 504: "timeout_error"}

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.TYPES.get(self.status, "server_error"),
                          "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Settings:
    """What the server applies to every request.

    Attributes:
        model_id: the name `/v1/models` lists; a request naming another model gets a 404.
        config: the default decode record (a request's `dllm` object changes parts of it).
        max_tokens: the largest canvas (`gen_length`) a request may ask for.
        chat_template: wrap chat messages in the tokenizer's chat template when it has one.
        prepare: completes a request's record for this model (e.g. AdaBlock's delimiter ids from
            the tokenizer); identity by default.
        scheduler_kinds: registries a request's scheduler name is looked up in, in order (a
            causal LM also takes the AR-only draft-length rules: `("scheduler", "draft_length")`).
        presets: records a request may start from by name (`dllm.preset` or the model name
            `MODEL_ID:NAME`), loaded and checked against the model at start-up (`--presets`).
        adapters: names of the LoRA adapters attached unmerged at start-up (`--adapter
            NAME=DIR`); a request picks one by the model name `MODEL_ID:NAME`.
        max_request_bytes: the budget of one request's step (`dllm_decode.cost`): a request
            estimated over it is a 400 naming the option that scales it (None: no budget).
        vocab_size: the model's vocabulary, for that estimate (None: the tokenizer's length).
        records: (not a field) the decode records built for requests that change nothing in
            them but `max_tokens`, by (preset, max_tokens); `prepare` must be a pure function.
    """

    model_id: str
    config: DecodeConfig
    max_tokens: int = 1024
    chat_template: bool = True
    prepare: Callable[[DecodeConfig], DecodeConfig] = field(default=lambda config: config)
    scheduler_kinds: tuple[str, ...] = ("scheduler",)
    presets: Mapping[str, DecodeConfig] = field(default_factory=dict)
    adapters: tuple[str, ...] = ()
    max_request_bytes: int | None = None
    vocab_size: int | None = None

    def __post_init__(self) -> None:
        check_types(self)
        # the records of requests that change nothing but max_tokens, by (preset, max_tokens):
        # built once (building one took about a quarter of a request's parsing), shared after
        object.__setattr__(self, "records", {})
        if clash := sorted(set(self.adapters) & set(self.presets)):
            raise ValueError(f"{clash[0]!r} names both an adapter and a preset; rename one")
        if not self.model_id.strip():
            raise ValueError("model_id must be a non-empty name")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")


@dataclass(frozen=True)
class Job:
    """A validated request.

    Attributes:
        kind: `chat` or `completion`.
        prompt: token ids.
        config: the request's decode record.
        max_tokens: the answer cut (None: the canvas).
        stream, include_usage: SSE streaming, and a usage chunk at its end.
        stops: stop strings (the answer ends before the first one).
        stream_mode: `committed` (chunks carry final text) or `provisional` (also the canvas
            after each step).
        id, created: the response's id and creation time (int seconds).
        warning: a one-line note for the reply (words of the prompt the tokenizer does not
            know), or None.
    """

    kind: str
    prompt: tuple[int, ...]
    config: DecodeConfig
    max_tokens: int | None
    stream: bool
    include_usage: bool
    stops: tuple[str, ...]
    id: str
    created: int
    warning: str | None = None
    preset: str | None = None
    stream_mode: str = "committed"
    adapter: str | None = None


def parse_job(kind: str, body: Any, settings: Settings, tokenizer: Any) -> Job:
    """A request body -> a `Job`.

    Raises:
        APIError: 400 for anything malformed, unknown, unsupported or out of range (naming the
            parameter), 404 for another model's name.
    """
    if not isinstance(body, Mapping):
        raise APIError(400, "the request body must be a JSON object")
    check_depth(body)
    unknown = sorted(set(body) - KEYS[kind])
    if unknown:
        raise APIError(400, f"unrecognized request argument(s) {unknown}; dLLM options go in the "
                            f"`dllm` object ({', '.join(DLLM_KEYS)})", param=unknown[0])
    for name, neutral in UNSUPPORTED.items():
        if name in body and not neutral(body[name]):
            raise APIError(400, f"{name}={body[name]!r} is not supported by this server", param=name)
    if (refused := router_compat.refusal(kind, body)) is not None:
        raise APIError(400, refused.message, param=refused.param)
    check_shape(kind, body)
    adapter = _adapter(body, settings)
    preset = _preset(body if adapter is None else {**body, "model": settings.model_id}, settings)
    text_or_ids = _chat_text(body, settings, tokenizer) if kind == "chat" else _prompt(body, tokenizer)
    max_tokens = _max_tokens(body, kind)
    config = _config(body, settings, max_tokens, preset)
    prompt = _encode(text_or_ids, tokenizer)
    _check_cost(config, len(prompt), settings, tokenizer)
    stream = bool(body.get("stream"))
    options = body.get("stream_options")
    if options is not None and not stream:
        raise APIError(400, "stream_options is only allowed when stream is true", param="stream_options")
    include_usage = bool((options or {}).get("include_usage"))
    stream_mode = (body.get("dllm") or {}).get("stream_mode") or "committed"
    if stream_mode != "committed" and not stream:
        raise APIError(400, f"dllm.stream_mode {stream_mode!r} applies to streamed replies: send stream: true",
                       param="dllm.stream_mode")
    prefix = "chatcmpl" if kind == "chat" else "cmpl"
    user_text = _user_text(body, kind)
    warning = unknown_words_warning(tokenizer, user_text, prompt) if user_text and tokenizer is not None else None
    return Job(kind=kind, prompt=prompt, config=config, max_tokens=max_tokens, stream=stream,
               include_usage=include_usage, stops=_stops(body.get("stop")),
               id=f"{prefix}-{uuid.uuid4().hex}", created=int(time.time()), warning=warning, preset=preset,
               stream_mode=stream_mode, adapter=adapter)


def _adapter(body: Mapping[str, Any], settings: Settings) -> str | None:
    """The LoRA adapter a request's model name `MODEL_ID:NAME` picks among those the server
    attached at start-up (a name, never a folder), or None."""
    model = body.get("model")
    head, sep, tag = model.rpartition(":") if isinstance(model, str) else ("", "", "")
    return tag if sep and head == settings.model_id and tag in settings.adapters else None


def _check_cost(config: DecodeConfig, prompt_length: int, settings: Settings, tokenizer: Any) -> None:
    """A 400 naming the option when the request's step is over the server's budget."""
    vocab = settings.vocab_size or (len(tokenizer) if tokenizer is not None and hasattr(tokenizer, "__len__") else 0)
    if settings.max_request_bytes is None or not vocab:
        return
    try:
        check_budget(config, prompt_length, vocab, settings.max_request_bytes)
    except OverBudget as err:
        raise APIError(400, str(err), param=err.option) from None


def _preset(body: Mapping[str, Any], settings: Settings) -> str | None:
    """The preset a request starts from: `dllm.preset`, or the task tag of a model name
    `MODEL_ID:NAME`; None for the server's default. Names only, among the server's presets (a
    request never names a file); another model's name is a 404."""
    model = body.get("model")
    tag = None
    if model is not None and model != settings.model_id:
        head, sep, tag = model.rpartition(":")
        if not sep or head != settings.model_id:
            raise APIError(404, f"the model {model!r} does not exist; this server serves "
                                f"{settings.model_id!r}", param="model", code="model_not_found")
    given = (body.get("dllm") or {}).get("preset")
    if given is not None and tag is not None and given != tag:
        raise APIError(400, f"the model name's preset {tag!r} and dllm.preset {given!r} differ; give one",
                       param="dllm.preset")
    name = given if given is not None else tag
    if name is not None and name not in settings.presets:
        known = ", ".join(sorted(settings.presets)) or \
            "none (`serve --presets FILE` loads them; a requests file takes the command's --preset)"
        also = f"; adapters loaded: {', '.join(settings.adapters)}" if settings.adapters and given is None else ""
        raise APIError(400, f"unknown preset {name[:80]!r}; presets loaded: {known}{also}",
                       param="dllm.preset" if given is not None else "model")
    return name


def check_depth(value: Any, limit: int = MAX_DEPTH) -> None:
    """Refuse JSON nested deeper than `limit` (iteratively: no recursion to exhaust).

    Raises:
        APIError: 400 naming the limit.
    """
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, Mapping) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, (Mapping, list)):
                if depth + 1 > limit:
                    raise APIError(400, f"the request body is nested deeper than {limit} levels")
                stack.append((child, depth + 1))


UNION_MESSAGES = {
    "prompt": "prompt must be a non-empty string or a list of token ids",
    "stop": f"stop must be a non-empty string or a list of up to {MAX_STOPS}",
    "messages[].content": "messages[].content must be text (a string or text parts)",
    "dllm.scheduler": "dllm.scheduler must be a registered name or an object with `name`",
    "dllm.cache": "dllm.cache must be a registered name or an object with `name`",
    "dllm.filters[]": "dllm.filters[] must be a registered name or an object with `name`",
}
"""Messages for fields that accept several shapes (the first shape's error alone would mislead)."""
EXPECTED = {"bool_type": "true or false", "int_type": "an integer", "float_type": "a number",
            "string_type": "a string", "list_type": "a list", "dict_type": "an object",
            "model_type": "an object", "model_attributes_type": "an object"}


def check_shape(kind: str, body: Mapping[str, Any]) -> None:
    """The body's shape and types, checked with the pydantic request model in strict mode
    (`schema`); the first error becomes one line naming the parameter.

    Raises:
        APIError: 400.
    """
    from pydantic import ValidationError

    from dllm_decode.serve import schema

    model = schema.ChatCompletionRequest if kind == "chat" else schema.CompletionRequest
    try:
        model.model_validate(body)
    except ValidationError as err:
        raise _shape_error(err.errors()[0]) from None


def _shape_error(error: Mapping[str, Any]) -> APIError:
    """A pydantic error -> the server's 400, worded as the rest of its messages."""
    parts, through_union = [], False
    for part in error.get("loc", ()):
        if isinstance(part, int):
            parts.append(f"[{part}]")
        elif "[" in part or part in ("str", "int", "float", "bool", "TextPart") or part[:1].isupper():
            through_union = True                    # a shape tag of a field with several shapes
            break
        else:
            parts.append(("." if parts else "") + part)
    param = "".join(parts) or None
    kind, value, context = error.get("type"), error.get("input"), error.get("ctx") or {}
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    if kind == "extra_forbidden" and param and param.startswith("dllm."):
        return APIError(400, f"unknown dllm option(s) [{param[5:]!r}]; valid: {list(DLLM_KEYS)}", param=param)
    if kind == "extra_forbidden" and param and param.startswith("stream_options"):
        return APIError(400, "stream_options must be an object with `include_usage`", param="stream_options")
    if through_union:
        general = re.sub(r"\[\d+\]", "[]", param or "")
        message = UNION_MESSAGES.get(general, f"{general} has the wrong shape").replace(general, param or "", 1)
        return APIError(400, f"{message}, got {shown}", param=param)
    if kind == "missing":
        return APIError(400, f"{param} is required", param=param)
    if kind == "literal_error":
        return APIError(400, f"{param} must be one of {context.get('expected')}, got {shown}", param=param)
    if kind == "greater_than_equal":
        return APIError(400, f"{param} must be an integer >= {context.get('ge')}, got {shown}", param=param)
    if kind == "too_short":
        return APIError(400, f"{param} must be a non-empty list", param=param)
    if kind in EXPECTED:
        return APIError(400, f"{param} must be {EXPECTED[kind]}, got {shown}", param=param)
    return APIError(400, f"{param}: {error.get('msg', 'invalid value')}", param=param)


def _user_text(body: Mapping[str, Any], kind: str) -> str:
    """The text the user wrote (the prompt, or the messages' contents), for the unknown-word note."""
    if kind == "completion":
        prompt = body.get("prompt")
        prompt = prompt[0] if isinstance(prompt, list) and len(prompt) == 1 else prompt
        return prompt if isinstance(prompt, str) else ""
    return " ".join(_content(m.get("content"), i) for i, m in enumerate(body.get("messages") or []))


def _prompt(body: Mapping[str, Any], tokenizer: Any = None) -> str | list[int]:
    """`prompt`: a string, a token-id list, or a one-element list of either."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        _check_text(prompt, tokenizer, "prompt")
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                   for t in prompt):
        return prompt
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise APIError(400, "one prompt per request (send several requests to batch)", param="prompt")
    raise APIError(400, "prompt must be a non-empty string or a list of token ids", param="prompt")


def _chat_text(body: Mapping[str, Any], settings: Settings, tokenizer: Any) -> str:
    """The messages as one prompt: the tokenizer's chat template, or the lone user message's
    text when there is no template (or it is turned off)."""
    plain = []
    for i, message in enumerate(body["messages"]):            # shapes checked by `check_shape`
        content = _content(message.get("content"), i)
        _check_text(content, tokenizer, f"messages[{i}].content")
        plain.append({"role": message["role"], "content": content})
    has_template = settings.chat_template and getattr(tokenizer, "chat_template", None)
    if len(plain) == 1 and plain[0]["role"] == "user":
        try:
            return chat_prompt(tokenizer, plain[0]["content"], settings.chat_template)
        except ValueError as err:
            raise APIError(400, first_line(err), param="messages[0].content") from None
    if not has_template:
        raise APIError(400, "this model has no chat template: send a single user message",
                       param="messages")
    try:
        return render_chat(tokenizer, plain)
    except ValueError as err:
        raise APIError(400, first_line(err), param="messages") from None


def _content(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, Mapping) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise APIError(400, f"messages[{i}].content must be text (a string or text parts)",
                   param=f"messages[{i}].content")


def _check_text(text: str, tokenizer: Any, param: str) -> None:
    try:
        check_text(text, tokenizer, param)
    except (ValueError, TypeError) as err:
        raise APIError(400, first_line(err), param=param) from None


def _encode(prompt: str | list[int], tokenizer: Any) -> tuple[int, ...]:
    if isinstance(prompt, str):
        if tokenizer is None:
            raise APIError(400, "this model has no tokenizer: send the prompt as token ids", param="prompt")
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"] if prompt.strip() else []
    else:
        ids = prompt
    if not ids:
        raise APIError(400, "the prompt is empty", param="prompt")
    mask = getattr(tokenizer, "mask_token_id", None)
    try:
        return check_token_ids(ids, mask_id=mask if isinstance(mask, int) else None, where="prompt")
    except (ValueError, TypeError) as err:
        raise APIError(400, first_line(err), param="prompt") from None


def _max_tokens(body: Mapping[str, Any], kind: str) -> int | None:
    names = ["max_tokens"] + (["max_completion_tokens"] if kind == "chat" else [])
    given = [(n, body[n]) for n in names if body.get(n) is not None]
    if not given:
        return None
    return given[-1][1]                                       # an int >= 1 (`check_shape`)


def _stops(stop: Any) -> tuple[str, ...]:
    stops = [stop] if isinstance(stop, str) else stop
    if stops is None:
        return ()
    if (not isinstance(stops, list) or len(stops) > MAX_STOPS
            or not all(isinstance(s, str) and s for s in stops)):
        raise APIError(400, f"stop must be a non-empty string or a list of up to {MAX_STOPS}", param="stop")
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        raise APIError(400, f"a stop string may have at most {MAX_STOP_CHARS} characters", param="stop")
    return tuple(stops)


def _config(body: Mapping[str, Any], settings: Settings, max_tokens: int | None,
            preset: str | None = None) -> DecodeConfig:
    """The server's record (or its `preset`'s) with the request's `dllm` object, `temperature`
    and `seed` applied.

    The canvas is `dllm.gen_length`, else `max_tokens` rounded up to whole blocks (the answer is
    cut at `max_tokens`), else the server's. A `scheduler` / `cache` given as a name or with a
    `name` replaces the default; an object without `name` changes fields of the default one.
    A request that sets none of these gets the record built for the first such request (records
    are immutable; `Settings.records` holds up to `MAX_RECORDS`).
    """
    plain = not body.get("dllm") and body.get("temperature") is None and body.get("seed") is None
    key = (preset, max_tokens) if plain else None
    if key is not None and (known := settings.records.get(key)) is not None:
        return known
    config = _build_config(body, settings, max_tokens, preset)
    if key is not None and len(settings.records) < MAX_RECORDS:
        settings.records[key] = config
    return config


MAX_RECORDS = 256
"""How many (preset, max_tokens) records `Settings.records` keeps."""


def _build_config(body: Mapping[str, Any], settings: Settings, max_tokens: int | None,
                  preset: str | None) -> DecodeConfig:
    dllm = body.get("dllm") or {}                             # an object of DLLM_KEYS (`check_shape`)
    base = settings.config if preset is None else settings.presets[preset]
    data: dict[str, Any] = {**base.to_dict(), "filters": list(base.filters)}
    started = [base.scheduler, base.cache, *base.filters]
    try:
        check_options(settings.scheduler_kinds, dllm.get("scheduler"), started, "dllm.scheduler")
        check_options(("cache",), dllm.get("cache"), started, "dllm.cache")
        if isinstance(dllm.get("filters"), list):
            for i, spec in enumerate(dllm["filters"]):
                check_options(("filter",), spec, started, f"dllm.filters[{i}]")
    except OptionError as err:
        raise APIError(400, str(err), param=err.param) from None
    try:
        data["scheduler"] = _part(settings.scheduler_kinds, base.scheduler, dllm.get("scheduler"))
        data["cache"] = _part(("cache",), base.cache, dllm.get("cache"))
    except (ValueError, TypeError) as err:
        part = "scheduler" if "scheduler" in str(err) else "cache"
        raise APIError(400, first_line(err), param=f"dllm.{part}") from None
    for name in ("filters", "block_length", "stop_at_eos"):
        if dllm.get(name) is not None:                 # null: the server's default, as in OpenAI
            data[name] = dllm[name]
    for name in ("temperature", "seed"):
        if body.get(name) is not None:
            data[name] = body[name]
    if dllm.get("gen_length") is not None:
        data["gen_length"] = dllm["gen_length"]
    elif max_tokens is not None:
        block = data["block_length"]
        data["gen_length"] = -(-max_tokens // block) * block if type(block) is int and block > 0 \
            else max_tokens                            # integer ceil: exact for any size
    try:
        config = settings.prepare(DecodeConfig.from_dict(data))
    except RecursionError:
        raise APIError(400, "the dllm object is nested too deeply", param="dllm") from None
    except (ValueError, TypeError) as err:
        sent = {*dllm, *(n for n in ("temperature", "seed") if body.get(n) is not None)}
        raise APIError(400, first_line(err), param=_param_of(first_line(err), sent)) from None
    if config.gen_length > settings.max_tokens:
        raise APIError(400, f"the canvas of {config.gen_length} tokens exceeds this server's limit "
                            f"of {settings.max_tokens} (max_tokens / dllm.gen_length)",
                       param="max_tokens" if dllm.get("gen_length") is None else "dllm.gen_length")
    return config


def _part(kinds: tuple[str, ...], default: Any, given: Any) -> Any:
    """A scheduler or cache: the default object, a named one, or the default with some fields
    changed (an object without `name`). The first registry kind that has the name builds it."""
    if given is None:
        return default
    if isinstance(given, Mapping) and "name" not in given:
        given = {**component_dict(default), **given}
    name = given if isinstance(given, str) else given.get("name") if isinstance(given, Mapping) else None
    if not isinstance(name, str):
        raise ValueError(f"{kinds[0]} must be a name or an object with `name`, got {given!r}")
    kind = next((k for k in kinds if name in registry(k)), kinds[0])
    return component(kind, given)


def _param_of(message: str, sent: set[str]) -> str:
    """The parameter a decode-record error is about: of the names the message mentions, one the
    request set, else the first."""
    words = set(re.findall(r"[a-z_]+", message))
    named = [n for n in (*DLLM_KEYS, "temperature", "seed") if n in words or n.rstrip("s") in words]
    pick = next((n for n in named if n in sent), named[0] if named else None)
    if pick is None:
        return "dllm"
    return pick if pick in ("temperature", "seed") else f"dllm.{pick}"


class StopText:
    """Cuts a growing answer at the first stop string, holding back text that may begin one.

    `feed(delta)` returns the text safe to send; `hit` turns True once a stop string appeared
    (the text after it is never sent); `flush()` returns the held-back rest at the end.
    """

    def __init__(self, stops: tuple[str, ...]):
        self.stops = stops
        self.text = ""
        self.sent = 0
        self.hit = False

    def feed(self, delta: str) -> str:
        if self.hit:
            return ""
        self.text += delta
        found = [i for i in (self.text.find(s, max(0, self.sent - len(s) + 1)) for s in self.stops) if i >= 0]
        if found:
            self.hit = True
            self.text = self.text[:min(found)]
            return self._send(len(self.text))
        hold = max((k for s in self.stops for k in range(1, len(s)) if self.text.endswith(s[:k])), default=0)
        return self._send(len(self.text) - hold)

    def flush(self) -> str:
        return self._send(len(self.text))

    def _send(self, end: int) -> str:
        out = self.text[self.sent:end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return out


# -- response bodies --------------------------------------------------------------------------

def usage(output: Output) -> dict[str, Any]:
    """Token counts: the prompt, and the answer without the canvas's end-of-text padding (cut
    at a stop string, the tokens of the returned text only); `prompt_tokens_details.cached_tokens`
    (OpenAI's field): prompt tokens whose K/V came from the prefix cache."""
    return {"prompt_tokens": output.prompt_tokens, "completion_tokens": len(output.tokens),
            "total_tokens": output.prompt_tokens + len(output.tokens),
            "prompt_tokens_details": {"cached_tokens": output.cached_tokens}}


def extension(job: Job, output: Output) -> dict[str, Any]:
    """The `dllm` object of a reply: the resolved decode record and the request's figures."""
    return {"config": job.config.to_dict(), **({"preset": job.preset} if job.preset else {}),
            **({"adapter": job.adapter} if job.adapter else {}), "nfe": output.nfe, "seconds": round(output.seconds, 6),
            "queued_seconds": round(output.queued, 6)}


def reply(job: Job, model_id: str, output: Output, text: str, finish_reason: str) -> dict[str, Any]:
    """A non-streamed `chat.completion` or `text_completion`."""
    if job.kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "logprobs": None, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    body = {"id": job.id, "object": "chat.completion" if job.kind == "chat" else "text_completion",
            "created": job.created, "model": model_id, "choices": [choice], "usage": usage(output),
            "dllm": extension(job, output)}
    if job.warning:
        body["warning"] = job.warning
    return body


def chunk(job: Job, model_id: str, text: str | None = None, finish_reason: str | None = None,
          role: bool = False, output: Output | None = None) -> dict[str, Any]:
    """One streamed chunk: new text, the opening role (chat), the finish reason, or (with
    `output` and no text) the closing usage chunk with `choices: []`."""
    body: dict[str, Any] = {"id": job.id, "object": "chat.completion.chunk" if job.kind == "chat"
                            else "text_completion", "created": job.created, "model": model_id}
    if output is not None:
        body.update(choices=[], usage=usage(output), dllm=extension(job, output))
        return body
    if job.kind == "chat":
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
    body["choices"] = [choice]
    if job.include_usage:
        body["usage"] = None
    if job.warning and finish_reason is not None:
        body["warning"] = job.warning
    return body


def provisional_chunk(body: dict[str, Any], draft: Any, sent: str) -> dict[str, Any]:
    """A streamed chunk with a provisional stream's canvas as its top-level `dllm` object
    (`dllm_decode.provisional.Draft.to_dict`; `committed_text` is the text sent so far, after
    stop-string cuts); the chunk unchanged without a draft."""
    if draft is None:
        return body
    return {**body, "dllm": {**draft.to_dict(), "committed_text": sent}}
