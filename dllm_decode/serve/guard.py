"""The limits every route gets, as one ASGI middleware in front of the application.

- body size: a `Content-Length` over `max_body_bytes` is a 413 before a byte of the body is read;
  a chunked body is counted as it arrives and refused the moment it passes the limit;
- read time: a body not complete within `body_timeout` seconds (a client that stops mid-way)
  is a 408;
- nesting: a JSON body nested deeper than `max_depth` is a 400 (parsed off the event loop, in
  the server's CPU thread, so a big body never stalls `/health`);
- one access line per request at INFO (`dllm_decode.serve.access`): client, method, path,
  status, seconds;
- the request counter and latency histogram of `/metrics` (`Metrics`).

Errors are OpenAI's JSON (`APIError.body()`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from dllm_decode.serve.protocol import APIError, check_depth

access_log = logging.getLogger("dllm_decode.serve.access")

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class Guard:
    """ASGI middleware applying the body limits, the access log and the request metrics.

    Args:
        app: the application behind it.
        limits: `max_body_bytes` (then 413), `body_timeout` seconds for the whole body (then
            408) and `max_depth` of JSON nesting (then 400): the server's `Limits`.
        offload: runs a CPU-bound function off the event loop (`await offload(fn, *args, size=)`;
            the body's `size` in bytes lets it run a small body's work in place).
        metrics: where requests are counted (None: not counted).
    """

    def __init__(self, app: Any, limits: BodyLimits, offload: Callable[..., Awaitable[Any]],
                 metrics: Any = None):
        self.app, self.limits, self.offload, self.metrics = app, limits, offload, metrics

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.monotonic()
        status = {"code": 500}

        async def sending(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            try:
                body = await self._read(scope, receive)
            except APIError as err:
                await _reply(sending, err)
                return
            replay = _replayer(body, receive)
            await self.app(scope, replay, sending)
        finally:
            seconds = time.monotonic() - began
            client = scope.get("client")
            who = f"{client[0]}:{client[1]}" if client else "-"
            access_log.info('%s "%s %s" %d %.3fs', who, scope.get("method", "-"), scope.get("path", "-"),
                            status["code"], seconds)
            if self.metrics is not None:
                self.metrics.count_request(scope.get("path", ""), status["code"], seconds)

    async def _read(self, scope: dict[str, Any], receive: Receive) -> bytes:
        """The whole body, within the size and time limits, and checked for nesting when JSON."""
        limits = self.limits
        length = dict(scope.get("headers") or ()).get(b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                raise APIError(400, "the Content-Length header is not a number") from None
            if declared > limits.max_body_bytes:
                raise APIError(413, f"the request body of {declared} bytes exceeds this server's limit "
                                    f"of {limits.max_body_bytes} bytes", code="request_too_large")
        chunks: list[bytes] = []
        size = 0
        deadline = time.monotonic() + limits.body_timeout
        while True:
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise asyncio.TimeoutError
                message = await asyncio.wait_for(receive(), left)
            except asyncio.TimeoutError:
                raise APIError(408, f"the request body did not arrive within {limits.body_timeout:g} s",
                               code="request_timeout") from None
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limits.max_body_bytes:
                raise APIError(413, f"the request body exceeds this server's limit of "
                                    f"{limits.max_body_bytes} bytes", code="request_too_large")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if body.strip()[:1] in (b"{", b"["):
            parsed = await self.offload(_check_nesting, body, limits.max_depth, size=len(body))
            if parsed is not _INVALID:               # the route reads it instead of parsing again
                scope.setdefault("state", {})[PARSED_BODY] = parsed
        return body


PARSED_BODY = "dllm_parsed_body"
"""Key in the request's `scope["state"]` of the JSON body the guard already parsed."""
_INVALID = object()


def _check_nesting(body: bytes, max_depth: int) -> Any:
    """The JSON body, parsed; the 400 for one nested deeper than `max_depth`. Invalid JSON gives
    `_INVALID` (the route reports it)."""
    try:
        value = json.loads(body)
    except RecursionError:
        raise APIError(400, f"the request body is nested deeper than {max_depth} levels") from None
    except ValueError:
        return _INVALID
    check_depth(value, max_depth)
    return value


def _replayer(body: bytes, receive: Receive) -> Receive:
    """A `receive` that hands the application the body already read, then waits for the
    client's disconnect as the original would."""
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _reply(send: Send, err: APIError) -> None:
    payload = json.dumps(err.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
               (b"connection", b"close")]
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": payload, "more_body": False})
