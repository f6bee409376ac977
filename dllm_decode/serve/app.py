"""The HTTP server: FastAPI routes over an `EngineWorker`, run by uvicorn (the `[serve]` extra;
importing this module needs FastAPI).

Routes: `GET /health`, `GET /v1/models`, `GET /metrics` (Prometheus text), `GET /openapi.json`,
`POST /v1/completions`, `POST /v1/chat/completions` (streamed as server-sent events with
`"stream": true`). Every error is OpenAI's JSON with a 4xx/5xx status: 400 bad request (too deep
included), 404 unknown model or route, 405 wrong method, 408 a body that did not arrive in time,
413 a body over the limit, 429 queue full, 503 shutting down, 504 request timeout, 500 a failed
decode.

The event loop does no CPU work of size: JSON parsing, the request check and tokenising of a body
over `INLINE_BYTES` run in one CPU thread (`ServerState.offload`), the model in the engine's
thread, so `/health` answers while a big request is refused or a long prompt is tokenised. A
smaller body is parsed on the loop itself: its work (a fraction of a millisecond) costs less than
the two thread hand-offs it would take. Every route sits behind `guard.Guard` (body size, body
read time, nesting, access log, metrics).

What a streamed chunk carries: the answer text that became *final* since the previous chunk,
i.e. the newly committed tokens before the first still-masked position (`Decoding.snapshot`).
A dLLM commits out of order inside a block, so text arrives in bursts, often a block at a time;
it is never revised.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import math
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from fastapi import Request as HTTPRequest   # module level: FastAPI reads the route annotations

from dllm_decode.cost import MAX_ROWS
from dllm_decode.engine import Output, Request, Update
from dllm_decode.serve import probes
from dllm_decode.serve.mailbox import Mailbox
from dllm_decode.serve.metrics import Metrics, prefix_stats
from dllm_decode.serve.protocol import (MAX_DEPTH, APIError, Job, Settings, StopText, chunk, parse_job,
                                        provisional_chunk, reply)
from dllm_decode.serve.worker import EngineWorker

log = logging.getLogger("dllm_decode.serve")

INLINE_BYTES = 8192
"""Bodies up to this size are parsed, checked and tokenised on the event loop (`ServerState.offload`)."""


@dataclass(frozen=True)
class Limits:
    """Admission limits of the server.

    Attributes:
        max_queue: requests that may wait for a free row; one more gets 429.
        request_timeout: seconds a request may take, queueing included (then 504 / an error
            event, and its row is freed).
        shutdown_timeout: seconds in-flight requests get to finish after a shutdown signal;
            the rest are cancelled (503 / an error event).
        max_body_bytes: the largest request body (then 413, before the body is read when the
            client declares its length).
        body_timeout: seconds a request body may take to arrive in full (then 408).
        max_depth: the deepest JSON nesting of a body (then 400).
    Raises:
        ValueError: a negative count, or a time that is not a finite number > 0.
    """

    max_queue: int = 64
    request_timeout: float = 600.0
    shutdown_timeout: float = 30.0
    max_body_bytes: int = 1 << 20
    body_timeout: float = 30.0
    max_depth: int = MAX_DEPTH

    def __post_init__(self) -> None:
        for name in ("max_queue", "max_body_bytes", "max_depth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "max_queue" else 1):
                raise ValueError(f"{name} must be an integer >= {0 if name == 'max_queue' else 1}, got {value!r}")
        if self.max_queue > 16 * MAX_ROWS:              # each waiting request holds its prompt
            raise ValueError(f"max_queue must be at most {16 * MAX_ROWS}, got {self.max_queue}")
        for name in ("request_timeout", "shutdown_timeout", "body_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not value > 0:
                raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")


def tensor_parallel_size(model: Any) -> int:
    """The tensor-parallel world size the served model is split over (1: one process holds it)."""
    groups = getattr(model, "tensor_parallel", None)
    return 1 if groups is None else groups.tp


class ServerState:
    """The worker, the settings, and the counters the routes share (event-loop side only)."""

    def __init__(self, worker: EngineWorker, settings: Settings, limits: Limits):
        self.worker, self.settings, self.limits = worker, settings, limits
        self.tokenizer = worker.engine.tokenizer
        self.in_flight = 0
        self.draining = False
        self.served = 0
        self.started = time.time()
        self.server: Any = None             # the uvicorn server, once `serve` runs
        self.playground = False             # serve the playground page at `/` (viz/playground.py)
        self.cpu = ThreadPoolExecutor(1, thread_name_prefix="dllm-cpu")   # tokenising, JSON
        self.offloaded = 0                  # calls sent to `cpu` and not yet returned
        self.mailbox: Mailbox | None = None # the engine's updates to the loop (`serve.mailbox`)
        self.metrics = Metrics(in_flight=lambda: self.in_flight,
                               queued=lambda: len(getattr(worker.engine, "waiting", ())),
                               prefix=lambda: prefix_stats(worker.engine))

    async def offload(self, fn: Callable[..., Any], *args: Any, size: int | None = None) -> Any:
        """`fn(*args)` on the CPU thread, or here on the loop when the work is that of a body of
        `size` <= `INLINE_BYTES` bytes and the CPU thread is idle: one at a time either way
        (tokenizers are not re-entrant)."""
        if size is not None and size <= INLINE_BYTES and not self.offloaded:
            return fn(*args)
        self.offloaded += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self.cpu, fn, *args)
        finally:
            self.offloaded -= 1

    def stop(self) -> None:
        """Shut down as a signal would (tests, embedding applications)."""
        self.drain()
        if self.server is not None:
            self.server.should_exit = True

    def public(self, err: APIError) -> dict[str, Any]:
        """`err`'s reply body, with the name the model was loaded by shown as the served model
        id: a reply never tells a client where the server's files are. Model-side messages name
        the model quoted (`errors.model_name`), which is replaced whatever the name; a path-like
        name (a separator, or a leading `.` or `~`) is replaced unquoted too. A bare word is not
        (a folder named `model` would turn every "model" in a message into the served id). A
        shipped model's name stays."""
        from dllm_decode.models.checkpoint import EMBEDDED_NAMES

        body = err.body()
        where, served = getattr(self.worker.engine.model, "name_or_path", None), self.settings.model_id
        if isinstance(where, str) and where.strip() and where not in (served, *EMBEDDED_NAMES):
            message = body["error"]["message"].replace(repr(where), repr(served))
            if any(sep in where for sep in ("/", "\\", os.sep)) or where.startswith((".", "~")):
                message = message.replace(where, served)
            body["error"]["message"] = message
        return body

    @property
    def capacity(self) -> int:
        return self.worker.engine.max_batch_size + self.limits.max_queue

    def drain(self) -> None:
        """Refuse new requests; cancel what still runs after `shutdown_timeout`."""
        if self.draining:
            return
        self.draining = True
        timer = threading.Timer(self.limits.shutdown_timeout, self.worker.cancel_all)
        timer.daemon = True
        timer.start()


def step_name(worker: Any) -> str:
    """How the worker's engine runs a model step: "eager", or its capture mode ("compile",
    "cuda-graphs"; a record that cannot be captured still runs eagerly)."""
    mode = getattr(getattr(worker, "engine", None), "capture", "off")
    return "eager" if mode == "off" else mode


def create_app(state: ServerState) -> Any:
    """The FastAPI application (the worker starts and stops with the app's lifespan)."""
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.openapi.utils import get_openapi
    from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.exceptions import HTTPException

    from dllm_decode.serve import schema
    from dllm_decode.serve.guard import PARSED_BODY, Guard

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        if not state.worker.thread.is_alive():
            state.worker.start()
        yield
        state.draining = True
        await asyncio.to_thread(state.worker.stop)

    app = FastAPI(title="dllm-decode", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.serve = state
    app.add_middleware(Guard, limits=state.limits, offload=state.offload, metrics=state.metrics)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(title="dllm-decode", version=_version(), routes=app.routes,
                                   description="OpenAI-compatible completions for diffusion LMs.")
            document.setdefault("components", {}).setdefault("schemas", {}).update(schema.components())
            app.openapi_schema = document
        return copy.deepcopy(app.openapi_schema)

    app.openapi = openapi                     # type: ignore[method-assign]

    def error(err: APIError) -> JSONResponse:
        return JSONResponse(state.public(err), status_code=err.status)

    @app.exception_handler(APIError)
    async def api_error(_: Any, err: APIError) -> JSONResponse:
        return error(err)

    @app.exception_handler(HTTPException)
    async def http_error(http: Any, err: HTTPException) -> JSONResponse:
        if err.status_code == 405:
            allowed = (err.headers or {}).get("Allow", "")
            return error(APIError(405, f"{http.method} is not allowed on {http.url.path}"
                                       + (f"; use {allowed}" if allowed else ""), code="method_not_allowed"))
        if err.status_code == 404:
            return error(APIError(404, f"no route {http.url.path}; routes: /v1/completions, "
                                       f"/v1/chat/completions, /v1/models, /health, /metrics, /openapi.json, "
                                       f"/tokenize, /get_model_info"))
        return error(APIError(err.status_code, str(err.detail)))

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Any, err: RequestValidationError) -> JSONResponse:
        first = (err.errors() or [{}])[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        return error(APIError(400, f"{where}: {first.get('msg', 'invalid request')}"))

    @app.exception_handler(Exception)
    async def internal_error(_: Any, err: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error(APIError(500, f"internal error: {type(err).__name__}"))

    errors = {status: {"model": schema.ErrorResponse} for status in (400, 404, 405, 408, 413, 429, 503)}

    @app.get("/health", response_model=None)
    async def health() -> Any:
        ok = state.worker.alive and not state.draining
        body = {"status": "ok" if ok else ("draining" if state.draining else "failed"),
                "model": state.settings.model_id, "in_flight": state.in_flight,
                "served": state.served, "uptime_seconds": round(time.time() - state.started, 3),
                "step": step_name(state.worker),
                "tensor_parallel": tensor_parallel_size(state.worker.engine.model)}
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics", response_model=None)
    async def metrics() -> Any:
        return PlainTextResponse(state.metrics.text(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models", response_model=None)
    async def models() -> Any:
        names = [state.settings.model_id] + [f"{state.settings.model_id}:{a}" for a in state.settings.adapters]
        return {"object": "list", "data": [{"id": name, "object": "model", "created": int(state.started),
                                            "owned_by": "dllm-decode"} for name in names]}

    async def handle(kind: str, http: HTTPRequest) -> Any:
        parsed = http.scope.get("state", {}).get(PARSED_BODY, _UNSET)      # parsed by the guard
        raw = await http.body()
        body = parsed if parsed is not _UNSET else await state.offload(_parse, raw, size=len(raw))
        job = await state.offload(parse_job, kind, body, state.settings, state.tokenizer, size=len(raw))
        _admit(state, job)
        updates = _submit(state, job)
        if job.stream:
            return StreamingResponse(_sse(state, job, updates), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        try:
            text, output, reason = await _collect(state, job, updates, http)
        finally:
            state.in_flight -= 1
        if reason in ("error", "cancelled"):
            raise _failure(output, reason, state)
        return JSONResponse(reply(job, state.settings.model_id, output, text, reason))

    probes.add_routes(app, state)

    @app.post("/v1/completions", response_model=None, openapi_extra=schema.request_body(schema.CompletionRequest),
              responses={200: {"model": schema.CompletionResponse}, **errors})
    async def completions(http: HTTPRequest) -> Any:
        return await handle("completion", http)

    @app.post("/v1/chat/completions", response_model=None,
              openapi_extra=schema.request_body(schema.ChatCompletionRequest),
              responses={200: {"model": schema.ChatCompletionResponse}, **errors})
    async def chat_completions(http: HTTPRequest) -> Any:
        return await handle("chat", http)

    if state.playground:
        from dllm_decode.viz.playground import add_playground

        add_playground(app, state.settings, state.tokenizer, getattr(state.worker.engine, "eos_ids", ()))
    return app


_UNSET = object()


def _version() -> str:
    from dllm_decode import __version__

    return __version__


def _parse(raw: bytes) -> Any:
    """A request body as JSON (on the CPU thread)."""
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise APIError(400, f"the request body is not valid JSON ({err})") from None
    except RecursionError:
        raise APIError(400, "the request body is nested too deeply") from None


def _admit(state: ServerState, job: Job) -> None:
    """Refuse when draining or full; check the prompt against the model; count it in."""
    if state.draining or not state.worker.alive:
        raise APIError(503, "the server is shutting down", code="shutting_down")
    if state.in_flight >= state.capacity:
        raise APIError(429, f"the server is full ({state.in_flight} requests in flight); retry later",
                       code="queue_full")
    try:
        engine = state.worker.engine
        mask = getattr(engine.model, "mask_token_id", None)
        if isinstance(mask, int) and mask in job.prompt:
            raise ValueError(f"the prompt holds the [MASK] id {mask}; prompts must be clean text")
        engine.check(_request(job))
    except (ValueError, TypeError) as err:
        message = str(err)
        if "context" in message:
            raise APIError(400, message, param="prompt", code="context_length_exceeded") from None
        param = ("prompt" if "prompt" in message else "dllm.cache" if "cache" in message else
                 "dllm.scheduler" if any(w in message for w in ("scheduler", "oracle", "delimiter"))
                 else None)
        raise APIError(400, message, param=param) from None
    state.in_flight += 1


def _request(job: Job) -> Request:
    return Request(id=job.id, prompt=job.prompt, config=job.config, max_tokens=job.max_tokens,
                   provisional=job.stream_mode == "provisional", adapter=job.adapter,
                   follow=job.stream or bool(job.stops))      # else the text is decoded once, at the end


class _Updates:
    """A request's updates as they arrive from the worker thread."""

    def __init__(self, state: ServerState, job: Job):
        self.state, self.job = state, job
        self.queue: asyncio.Queue[Update] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        if state.mailbox is None or state.mailbox.loop is not loop:
            state.mailbox = Mailbox(loop)
        self.mailbox = state.mailbox
        self.done = False
        self.tokens: list[int] = []
        self.draft: Any = None             # the last update's canvas (provisional streams)

    def put(self, update: Update) -> None:                # called on the worker thread
        self.mailbox.post(self.queue, update)

    async def next(self, timeout: float) -> Update:
        update = await asyncio.wait_for(self.queue.get(), timeout)
        self.tokens += update.tokens
        self.done = update.finished
        self.draft = update.draft
        return update

    def cancel(self) -> None:
        if not self.done:
            self.done = True
            self.state.worker.cancel(self.job.id)


def _submit(state: ServerState, job: Job) -> _Updates:
    updates = _Updates(state, job)
    state.worker.submit(_request(job), updates.put)
    return updates


async def _events(state: ServerState, job: Job, updates: _Updates,
                  http: Any = None) -> AsyncIterator[tuple[str, Output | None, str | None]]:
    """(new text, None, None) while the answer grows; finally ("", output, finish_reason).

    Enforces the request timeout and the stop strings (both cancel the engine request), and,
    given the HTTP request, polls for a client disconnect (streams learn it from the server)."""
    deadline = time.monotonic() + state.limits.request_timeout
    stops = StopText(job.stops)
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                updates.cancel()
                raise APIError(504, f"the request took longer than {state.limits.request_timeout:g} s",
                               code="timeout")
            try:
                update = await updates.next(min(left, 0.5))
            except asyncio.TimeoutError:
                if http is not None and await http.is_disconnected():
                    updates.cancel()
                    return
                continue
            text = stops.feed(update.text) if job.stops else update.text
            if stops.hit:
                updates.cancel()
                output = update.output or Output(stops.text, (), len(job.prompt), 0, 0.0, 0.0, "stop")
                kept = await state.offload(answer_tokens, state.tokenizer, stops.text, tuple(updates.tokens))
                yield text, replace(output, text=stops.text, tokens=kept), "stop"
                return
            if update.output is None:
                if text or update.draft is not None:
                    yield text, None, None
                continue
            yield text + stops.flush(), update.output, update.output.finish_reason
            return
    finally:
        updates.cancel()


async def _collect(state: ServerState, job: Job, updates: _Updates, http: Any) -> tuple[str, Output, str]:
    parts: list[str] = []
    async for text, output, reason in _events(state, job, updates, http):
        parts.append(text)
        if output is not None:
            state.served += 1
            if reason not in ("error", "cancelled"):
                _count(state, output)
            final = "".join(parts)
            return (output.text if output.text is not None and not job.stops else final), output, reason
    raise APIError(499, "the client disconnected")


def _failure(output: Output, reason: str, state: ServerState) -> APIError:
    if reason == "cancelled":
        return APIError(503, "the request was cancelled: the server is shutting down",
                        code="shutting_down")
    return APIError(500, f"decoding failed: {output.error}", code="decode_error")


async def _sse(state: ServerState, job: Job, updates: _Updates) -> AsyncIterator[str]:
    """The stream: a role chunk (chat), text chunks, the finish chunk, a usage chunk when asked,
    `[DONE]`. A failure mid-stream is an `{"error": ...}` event followed by `[DONE]`."""
    model = state.settings.model_id
    try:
        if job.kind == "chat":
            yield _event(chunk(job, model, text="", role=True))
        sent = ""
        async for text, output, reason in _events(state, job, updates):
            sent += text
            if output is None:
                yield _event(provisional_chunk(chunk(job, model, text=text), updates.draft, sent))
                continue
            if reason in ("error", "cancelled"):
                yield _event(state.public(_failure(output, reason, state)))
                break
            if text or updates.draft is not None:
                yield _event(provisional_chunk(chunk(job, model, text=text), updates.draft, sent))
            yield _event(chunk(job, model, text=None if job.kind == "chat" else "", finish_reason=reason))
            if job.include_usage:
                yield _event(chunk(job, model, output=output))
            state.served += 1
            _count(state, output)
        yield "data: [DONE]\n\n"
    except APIError as err:
        yield _event(state.public(err))
        yield "data: [DONE]\n\n"
    finally:
        updates.cancel()
        state.in_flight -= 1


def _count(state: ServerState, output: Output) -> None:
    state.metrics.count_decode(output.prompt_tokens, len(output.tokens), output.nfe,
                               output.seconds + output.queued)


def answer_tokens(tokenizer: Any, text: str, tokens: tuple[int, ...]) -> tuple[int, ...]:
    """The shortest prefix of `tokens` whose text covers `text` (an answer cut at a stop string
    counts only the tokens it returns); all of them without a tokenizer."""
    if tokenizer is None or not tokens:
        return tokens
    text = text.rstrip()                    # a cut before a word keeps its separator, no token of it
    low, high = 0, len(tokens)
    while low < high:                       # the text grows with the prefix: binary search
        middle = (low + high) // 2
        if len(tokenizer.decode(list(tokens[:middle]), skip_special_tokens=True)) >= len(text):
            high = middle
        else:
            low = middle + 1
    return tokens[:low]


def _event(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def serve(state: ServerState, host: str = "127.0.0.1", port: int = 8000, sock: Any = None,
          log_level: str = "info", ready: threading.Event | None = None) -> None:
    """Run the server until SIGINT/SIGTERM (or `state.server.should_exit`): on the signal it
    stops accepting connections, refuses new requests on open ones (503), lets in-flight requests
    finish for `shutdown_timeout` seconds, cancels the rest, and stops the worker.

    Args:
        sock: an already bound socket (tests bind port 0); else `host` and `port`.
        ready: set once the server accepts connections.
    """
    import uvicorn

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            state.drain()
            super().handle_exit(sig, frame)
            # uvicorn re-raises a captured signal after its shutdown (a traceback for SIGINT);
            # the shutdown here is complete, so the command exits 0 instead.
            self._captured_signals.clear()

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if ready is not None:
                ready.set()

    config = uvicorn.Config(create_app(state), host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=state.limits.shutdown_timeout + 5,
                            access_log=False, log_config=_log_config(log_level))
    server = _Server(config)
    state.server = server
    server.run(sockets=[sock] if sock is not None else None)



def _log_config(level: str) -> dict[str, Any]:
    """uvicorn's logging setup plus this package's loggers (the access line per request at INFO)."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["dllm_decode"] = {"handlers": ["default"], "level": level.upper(), "propagate": False}
    return config


@contextlib.contextmanager
def background(state: ServerState, host: str = "127.0.0.1", startup_timeout: float = 60.0) -> Any:
    """Run the server in a thread on a free port of `host`; yields its base URL and shuts it down
    (gracefully, as on a signal) on exit. For tests, benchmarks and notebooks."""
    import socket

    # IPPROTO_TCP named: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on sockets whose
    # proto says TCP, and with it on a reply sent in two writes waits ~40 ms for a delayed ACK
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    ready = threading.Event()
    thread = threading.Thread(target=serve, args=(state,), daemon=True, name="dllm-serve",
                              kwargs={"sock": sock, "log_level": "warning", "ready": ready})
    thread.start()
    try:
        if not ready.wait(startup_timeout):
            raise RuntimeError(f"the server did not start within {startup_timeout:g} s")
        yield f"http://{host}:{port}"
    finally:
        state.stop()
        thread.join(state.limits.shutdown_timeout + 15)
        sock.close()
