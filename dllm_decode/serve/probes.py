"""The routes load balancers probe (`router_compat` says what each answers): `/get_model_info`,
`/model_info`, `/get_server_info`, `/server_info`, `POST /tokenize`."""

from __future__ import annotations

from typing import Any

from dllm_decode.serve.protocol import APIError
from dllm_decode.serve.router_compat import model_info, tokenize


def add_routes(app: Any, state: Any) -> None:
    """The probe routes on `app` (the server's FastAPI application)."""
    from fastapi import Request as HTTPRequest
    from fastapi.responses import JSONResponse

    async def info() -> Any:
        return JSONResponse(model_info(state))

    async def server_info() -> Any:
        return JSONResponse({**model_info(state), "served": state.served, "in_flight": state.in_flight})

    for path in ("/get_model_info", "/model_info"):
        app.add_api_route(path, info, methods=["GET"], include_in_schema=path == "/get_model_info")
    for path in ("/get_server_info", "/server_info"):
        app.add_api_route(path, server_info, methods=["GET"], include_in_schema=path == "/get_server_info")

    async def tokenize_route(http: HTTPRequest) -> Any:
        from dllm_decode.serve.guard import PARSED_BODY

        body = http.scope.get("state", {}).get(PARSED_BODY)       # parsed by the guard
        try:
            return JSONResponse(await state.offload(tokenize, state, body))
        except (ValueError, TypeError) as err:
            raise APIError(400, str(err).splitlines()[0], param="prompt") from None

    tokenize_route.__annotations__["http"] = HTTPRequest     # resolved here: FastAPI reads it
    app.add_api_route("/tokenize", tokenize_route, methods=["POST"])
