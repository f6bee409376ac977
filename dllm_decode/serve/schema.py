"""Pydantic models of the OpenAI bodies this server reads and writes, for `GET /openapi.json`.

They describe the wire format (the fields, their types and ranges); the request validation itself
is `protocol.parse_job`, whose messages name the parameter in OpenAI's error shape. The routes
declare these models as their request and response schemas.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class DllmOptions(BaseModel):
    """The `dllm` extension object: decode options over the server's defaults. Components are a
    registered name or `{"name": ..., option: typed value}`; never a file path."""

    model_config = ConfigDict(extra="forbid")
    scheduler: str | dict[str, Any] | None = None
    cache: str | dict[str, Any] | None = None
    filters: list[str | dict[str, Any]] | None = None
    gen_length: int | None = Field(None, ge=1)
    block_length: int | None = Field(None, ge=1)
    stop_at_eos: bool | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool | None = None


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    seed: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = Field(None, description="Up to 4 stop strings.")
    user: str | None = None
    n: Literal[1] | None = None
    top_p: Literal[1] | None = None
    dllm: DllmOptions | None = None


class CompletionRequest(_Common):
    """`POST /v1/completions`."""

    prompt: str | list[int] | list[str] | list[list[int]] = Field(
        ..., description="Text or token ids (one prompt per request).")


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]


class ChatCompletionRequest(_Common):
    """`POST /v1/chat/completions`."""

    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int = Field(..., description="Tokens of the returned text (after stop cuts).")
    total_tokens: int


class DllmReply(BaseModel):
    config: dict[str, Any]
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
