"""One self-contained HTML file that replays a decode (`--trace-html FILE`,
`DecodeResult.to_html()`): the page's script and styles are inline and the frames are embedded
as JSON, so it opens with no network and no server."""

from __future__ import annotations

import json
import os
from importlib import resources
from typing import Any

from dllm_decode.viz.frames import SampleTrace, result_frames, token_labels, used_ids

PLACEHOLDER = "/*TRACE_DATA*/"
STATE_CODES = {"committed": "c", "provisional": "p", "masked": "m", "noise": "n"}


def trace_data(samples: list[SampleTrace], labels: dict[int, str], texts: list[str] | None = None,
               prompts: list[str] | None = None) -> dict[str, Any]:
    """The JSON the page reads: the token labels and, per sample, its frames (states one letter
    each), final canvas, answer text and per-position revision counts."""
    return {
        "labels": {str(k): v for k, v in labels.items()},
        "samples": [{
            "prompt": prompts[i] if prompts else "",
            "text": texts[i] if texts else " ".join(labels[t] for t in s.final[:s.answer_length]),
            "final": list(s.final), "revisions": list(s.revisions),
            "frames": [{"step": f.step, "tokens": list(f.tokens),
                        "state": "".join(STATE_CODES[x] for x in f.state),
                        "confidence": [None if c is None else round(c, 4) for c in f.confidence],
                        "committed": list(f.committed), "revised": list(f.revised)} for f in s.frames],
        } for i, s in enumerate(samples)],
    }


def render_html(data: dict[str, Any]) -> str:
    """The page with `data` embedded (`</` escaped so no text can close the script element)."""
    template = resources.files("dllm_decode.viz").joinpath("trace.html").read_text(encoding="utf-8")
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
    return template.replace(PLACEHOLDER, payload, 1)


def result_html(result: Any, tokenizer: Any = None, prompts: list[str] | None = None) -> str:
    """The HTML trace of a `DecodeResult` decoded with `trace=True`."""
    samples = result_frames(result)
    labels = token_labels(tokenizer, used_ids(samples))
    return render_html(trace_data(samples, labels, result.text, prompts))


def write_html(path: str | os.PathLike, result: Any, tokenizer: Any = None,
               prompts: list[str] | None = None) -> None:
    """Write `result_html` to `path` atomically (a reader never sees half a page)."""
    from dllm_decode.outputs import atomic_write

    atomic_write(path, result_html(result, tokenizer, prompts), what="HTML trace")
