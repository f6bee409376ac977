"""The playground `dllm-decode serve` hosts at `/`: one static page (`playground.html`) that
talks to the server only through its public HTTP API (`/v1/completions`, `/v1/chat/completions`
streamed), so it is also an example client of the provisional stream. The page is told what the
server was started with (model id, default record, presets, scheduler names, largest canvas)
in an embedded JSON block; it sends nothing a plain client could not."""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from typing import Any

PLACEHOLDER = "/*SERVER_CONFIG*/"
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def is_local(host: str) -> bool:
    """Whether `host` is a loopback address (the playground is on by default only there)."""
    return host in LOCAL_HOSTS or host.startswith("127.")


def end_of_text(tokenizer: Any, eos_ids: Sequence[int]) -> list[str]:
    """The end-of-text tokens as the provisional stream spells them (the tokenizer's per-token
    `batch_decode`, as the stream's canvas does), so the page can draw them as one mark."""
    if tokenizer is None or not eos_ids:
        return []
    return sorted(set(tokenizer.batch_decode([[int(i)] for i in eos_ids])))


def server_config(settings: Any, provisional: bool | None = None,
                  eos_text: Sequence[str] = ()) -> dict[str, Any]:
    """What the page offers: the server's model, default record, presets and scheduler names,
    whether requests may ask for the provisional stream (`dllm.stream_mode`; None: whether
    the protocol knows that key), and the end-of-text tokens' text (`end_of_text`)."""
    from dllm_decode.registry import names
    from dllm_decode.serve.protocol import DLLM_KEYS

    provisional = "stream_mode" in DLLM_KEYS if provisional is None else provisional
    return {"model": settings.model_id, "provisional": provisional, "config": settings.config.to_dict(),
            "presets": {name: config.to_dict() for name, config in sorted(settings.presets.items())},
            "schedulers": [n for kind in settings.scheduler_kinds for n in names(kind)],
            "max_tokens": settings.max_tokens, "end_of_text": list(eos_text)}


def playground_page(settings: Any, provisional: bool | None = None, eos_text: Sequence[str] = ()) -> str:
    """The page with the server's settings embedded (`</` escaped inside the script block)."""
    template = resources.files("dllm_decode.viz").joinpath("playground.html").read_text(encoding="utf-8")
    payload = json.dumps(server_config(settings, provisional, eos_text), separators=(",", ":")).replace("</", "<\\/")
    return template.replace(PLACEHOLDER, payload, 1)


def add_playground(app: Any, settings: Any, tokenizer: Any = None, eos_ids: Sequence[int] = ()) -> None:
    """Register `GET /` (the page, built once: the settings are fixed at start-up)."""
    from fastapi.responses import HTMLResponse

    page = playground_page(settings, eos_text=end_of_text(tokenizer, eos_ids))

    @app.get("/", include_in_schema=False)
    async def playground() -> Any:
        return HTMLResponse(page, headers={"Cache-Control": "no-cache"})
