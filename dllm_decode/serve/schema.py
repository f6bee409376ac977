"""Pydantic models of the OpenAI bodies this server reads and writes.

The request models check a body's shape and types in strict mode (no "true" for a boolean, no
1.0 for an integer): `protocol.parse_job` validates with them and words the first error as the
server's one-line message naming the parameter; what depends on the model and the server (the
prompt's tokens, the decode record, the canvas limit) is checked after. The routes declare the
same models as their request and response schemas, so `GET /openapi.json` documents exactly what
is validated.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


STRICT = ConfigDict(extra="forbid", strict=True)


class DllmOptions(BaseModel):
    """The `dllm` extension object: decode options over the server's defaults. Components are a
    registered name or `{"name": ..., option: typed value}`; never a file path."""

    model_config = STRICT
    scheduler: str | dict[str, Any] | None = None
    cache: str | dict[str, Any] | None = None
    filters: list[str | dict[str, Any]] | None = None
    gen_length: int | None = None
    block_length: int | None = None
    stop_at_eos: bool | None = None
    preset: str | None = Field(None, description="A preset the server was started with (--presets), by name "
                                                 "(a task tag); the other dllm options apply over it.")
    stream_mode: Literal["committed", "provisional"] | None = Field(
        None, description="committed (default): chunks carry final text only; provisional: each chunk "
                          "also carries the whole canvas after a step (a top-level `dllm` object).")


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool | None = None


NEUTRAL = "Accepted only at its neutral value (this server does not implement it)."


class _Common(BaseModel):
    model_config = STRICT
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = None
    seed: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = Field(None, description="Up to 4 stop strings.")
    user: str | None = None
    n: Any = Field(None, description=NEUTRAL + " (1)")
    top_p: Any = Field(None, description=NEUTRAL + " (1)")
    presence_penalty: Any = Field(None, description=NEUTRAL + " (0)")
    frequency_penalty: Any = Field(None, description=NEUTRAL + " (0)")
    logit_bias: Any = Field(None, description=NEUTRAL + " (empty)")
    logprobs: Any = Field(None, description=NEUTRAL + " (false)")
    dllm: DllmOptions | None = None


ROUTER = "Sent by load balancers (vllm-router, sglang-router); see `router_compat.FIELDS` for the values honoured."


class _Routed(_Common):
    ignore_eos: bool | None = Field(None, description=ROUTER + " (false)")
    no_stop_trim: bool | None = Field(None, description=ROUTER + " (false)")
    skip_special_tokens: bool | None = Field(None, description=ROUTER + " (true)")
    return_hidden_states: bool | None = Field(None, description=ROUTER + " (false)")


class CompletionRequest(_Routed):
    """`POST /v1/completions`."""

    prompt: str | list[int] | list[str] | list[list[int]] = Field(
        ..., description="Text or token ids (one prompt per request).")
    echo: Any = Field(None, description=NEUTRAL + " (false)")
    best_of: Any = Field(None, description=NEUTRAL + " (1)")
    suffix: Any = Field(None, description=NEUTRAL + " (empty)")


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True)
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True)
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]


class ChatCompletionRequest(_Routed):
    """`POST /v1/chat/completions`."""

    continue_final_message: bool | None = Field(None, description=ROUTER + " (false)")
    separate_reasoning: bool | None = Field(None, description=ROUTER + " (ignored)")
    stream_reasoning: bool | None = Field(None, description=ROUTER + " (ignored)")
    include_reasoning: bool | None = Field(None, description=ROUTER + " (ignored)")
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    top_logprobs: Any = Field(None, description=NEUTRAL + " (0)")


class PromptTokensDetails(BaseModel):
    cached_tokens: int = Field(..., description="Prompt tokens whose K/V came from the prefix cache "
                                                "(`serve --prefix-cache-bytes`; 0 when off).")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int = Field(..., description="Tokens of the returned text (after stop cuts).")
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class DllmReply(BaseModel):
    config: dict[str, Any]
    preset: str | None = None
    adapter: str | None = None
    nfe: int
    seconds: float
    queued_seconds: float


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None = None
    finish_reason: str | None


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: None = None
    finish_reason: str | None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    dllm: DllmReply
    warning: str | None = Field(None, description="Words of the prompt the tokenizer does not know.")


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    dllm: DllmReply
    warning: str | None = None


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail


def request_body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` for a route that reads `model` as its JSON body (validated by hand)."""
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}


def components() -> dict[str, Any]:
    """Every model's JSON schema, for the OpenAPI document's `components.schemas`."""
    out: dict[str, Any] = {}
    for model in (CompletionRequest, ChatCompletionRequest, CompletionResponse, ChatCompletionResponse,
                  ErrorResponse):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        out.update(schema.pop("$defs", {}))
        out[model.__name__] = schema
    return out
