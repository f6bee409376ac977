"""`dllm-decode --input requests.jsonl --output results.jsonl` and `dllm-decode --stream`.

A requests file holds one JSON object a line: `id` (optional; default the line number) and
`prompt`, plus optional `max_tokens`, `temperature`, `seed` and a `dllm` object, read exactly as
the server reads a chat request with that one user message (`dllm_decode.serve.protocol`). Results
are appended to the output as each request finishes (the engine's first-done-first-out order);
a re-run skips the ids already written, so an interrupted run resumes without redoing work.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

LINE_KEYS = {"id", "prompt", "max_tokens", "temperature", "seed", "dllm"}


def read_requests(input_path: str, output_path: str) -> list[tuple[str, dict[str, Any]]]:
    """The requests still to do, as (id, body), after checking both files: every line is read
    and checked before any model loads, and the output must be writable.

    Raises:
        click.BadParameter: an unreadable input, a bad line (named by number), a repeated id, an
            output that cannot be written or holds a corrupt line.
    """
    from dllm_decode.cli.options import writable_file
    from dllm_decode.eval.harness.records import read_records

    target = writable_file(output_path, "--output")
    try:
        lines = open(input_path, encoding="utf-8").read().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise click.BadParameter(f"cannot read {input_path!r}: {err}", param_hint="--input") from None
    requests: list[tuple[str, dict[str, Any]]] = []
    seen: set[str] = set()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{input_path}:{number}"
        try:
            body = json.loads(line)
        except json.JSONDecodeError as err:
            raise click.BadParameter(f"{where} is not valid JSON ({err.msg})", param_hint="--input") from None
        except RecursionError:
            raise click.BadParameter(f"{where} is nested too deeply to be a request", param_hint="--input") from None
        if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
            raise click.BadParameter(f"{where} needs an object with a string `prompt`", param_hint="--input")
        unknown = sorted(set(body) - LINE_KEYS)
        if unknown:
            raise click.BadParameter(f"{where}: unknown key(s) {unknown}; valid: {sorted(LINE_KEYS)}",
                                     param_hint="--input")
        request_id = str(body.pop("id", number))
        if request_id in seen:
            raise click.BadParameter(f"{where}: id {request_id!r} repeats an earlier line", param_hint="--input")
        seen.add(request_id)
        requests.append((request_id, body))
    if not requests:
        raise click.BadParameter(f"{input_path!r} holds no requests", param_hint="--input")
    try:
        done = {str(r.get("id")) for r in read_records(target)}
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--output") from None
    return [(i, body) for i, body in requests if i not in done]


def run_requests(model: Any, config: Any, requests: list[tuple[str, dict[str, Any]]], output_path: str,
                 chat_template: bool, batch_size: int, model_name: str) -> None:
    """Decode the requests with the engine and append each result when it finishes."""
    from dllm_decode.engine import Engine, Request
    from dllm_decode.eval.harness.records import append_records, repair
    from dllm_decode.serve.protocol import APIError, Settings, parse_job

    tokenizer = getattr(model, "tokenizer", None)
    settings = Settings(model_id=model_name, config=config, max_tokens=sys.maxsize,
                        chat_template=chat_template)
    engine = Engine(model, tokenizer, max_batch_size=batch_size)
    prompts: dict[str, str] = {}
    configs: dict[str, Any] = {}
    for request_id, body in requests:             # every line checked before decoding starts
        chat = {"messages": [{"role": "user", "content": body["prompt"]}],
                **{k: v for k, v in body.items() if k != "prompt"}}
        try:
            job = parse_job("chat", chat, settings, tokenizer)
            request = Request(request_id, job.prompt, job.config, job.max_tokens)
            engine.check(request)
        except (APIError, ValueError) as err:
            raise click.BadParameter(f"request {request_id!r}: {err}", param_hint="--input") from None
        engine.add(request)
        prompts[request_id], configs[request_id] = body["prompt"], job.config
    repair(output_path)
    finished = 0
    while engine.has_work:
        rows = []
        for update in engine.step():
            if update.output is None:
                continue
            out = update.output
            if out.finish_reason == "error":
                raise click.ClickException(f"request {update.request_id!r} failed: {out.error}")
            rows.append({"id": update.request_id, "prompt": prompts[update.request_id],
                         "text": out.text if out.text is not None else " ".join(map(str, out.tokens)),
                         "finish_reason": out.finish_reason, "answer_tokens": len(out.tokens),
                         "nfe": out.nfe, "seconds": out.seconds, "model": model_name,
                         "config": configs[update.request_id].to_dict()})
        append_records(output_path, rows)
        finished += len(rows)
    click.echo(f"{finished} request(s) written to {output_path}", err=True)


def stream_one(model: Any, config: Any, prompt: str) -> None:
    """Decode one prompt and print its answer as it becomes final."""
    from dllm_decode.engine import Engine, Request
    from dllm_decode.cli.options import usage_errors
    from dllm_decode.prompts import encode_prompts

    tokenizer = getattr(model, "tokenizer", None)
    engine = Engine(model, tokenizer, max_batch_size=1)
    with usage_errors():
        (ids,) = encode_prompts([prompt], tokenizer)
        request = Request("stream", ids, config)
        engine.add(request)
    while engine.has_work:
        for update in engine.step():
            if tokenizer is None and update.tokens:
                click.echo(" ".join(map(str, update.tokens)) + " ", nl=False)
            elif update.text:
                click.echo(update.text, nl=False)
            sys.stdout.flush()
            if update.output is not None and update.output.finish_reason == "error":
                raise click.ClickException(f"decoding failed: {update.output.error}")
    click.echo("")
