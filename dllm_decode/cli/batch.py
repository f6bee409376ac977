"""`dllm-decode --input requests.jsonl --output results.jsonl` and `dllm-decode --stream`.

A requests file holds one JSON object a line: `id` (optional; default the line number) and
`prompt`, plus optional `max_tokens`, `temperature`, `seed` and a `dllm` object, read exactly as
the server reads a chat request with that one user message (`dllm_decode.serve.protocol`). Results
are appended to the output as each request finishes (the engine's first-done-first-out order);
a re-run skips the requests already written, so an interrupted run resumes without redoing work.

The output is owned: a run holds its writer lock (`<output>.lock`, as `eval` does) while it
checks the files and again, re-reading what is done, from its first decode to its last result,
so a second run on the same output stops at once and no result is written twice; the
input and the output must be different files; special files (`/dev/null`, `/dev/full`) are
refused before any work. Resume keys on the id and a hash of the request line: a finished id
whose request changed since it was written is an error naming the id, never a stale answer; and
on the run: each result records the model identity and the decode record (`dllm_decode.runkey`),
and a resume with another model or decode settings is an error naming what changed.
A result that cannot be written (a full disk) stops the run with one line and exit status 1;
every result written before it stays, and a re-run resumes after it.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

LINE_KEYS = {"id", "prompt", "max_tokens", "temperature", "seed", "dllm"}


def request_hash(body: dict[str, Any]) -> str:
    """The digest a result records of its request line (all keys but `id`), so a resume can tell
    a changed request from a finished one."""
    from dllm_decode.eval.harness.records import stable_hash

    return stable_hash({k: v for k, v in body.items() if k != "id"}, 16)


def read_requests(input_path: str, output_path: str) -> list[tuple[str, dict[str, Any]]]:
    """The requests still to do, as (id, body), after checking both files: every line is read
    and checked before any model loads, and the output must be writable and not held by another
    run.

    Raises:
        click.BadParameter: an unreadable input, a bad line (named by number), a repeated id, an
            output that is the input, a special file, cannot be written, holds a corrupt line or
            a changed request under a finished id; another run holding the output.
    """
    from dllm_decode.cli.options import writable_file
    from dllm_decode.outputs import OutputError, check_output, same_file

    try:
        check_output(output_path, "--output file")
    except OutputError as err:
        raise click.BadParameter(str(err), param_hint="--output") from None
    if same_file(input_path, output_path):
        raise click.BadParameter(f"--output {output_path!r} is the --input file; results go to "
                                 f"another file (the requests would be overwritten)",
                                 param_hint="--output")
    target = writable_file(output_path, "--output")
    try:
        with _owned(target):
            return _pending(read_lines(input_path), target)
    except OutputError as err:
        raise click.BadParameter(str(err), param_hint="--output") from None


def _owned(target: Any) -> Any:
    from dllm_decode.outputs import output_lock

    return output_lock(target, "--output file", hint="wait for that run to finish or choose another --output")


def read_lines(input_path: str) -> list[tuple[str, dict[str, Any]]]:
    """Every request line of the input (a regular file or a pipe; a device such as /dev/zero
    never ends and is refused)."""
    import os
    import stat

    try:
        mode = os.stat(input_path).st_mode
        if stat.S_ISDIR(mode) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISSOCK(mode):
            raise click.BadParameter(f"{input_path!r} is not a requests file (a directory or a "
                                     f"device); give a JSONL file", param_hint="--input")
        with open(input_path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror.lower() if isinstance(err, OSError) and err.strerror else str(err)
        raise click.BadParameter(f"cannot read {input_path!r}: {reason}", param_hint="--input") from None
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
        if "id" in body and (isinstance(body["id"], bool) or not isinstance(body["id"], (str, int))
                             or not str(body["id"]).strip()):
            raise click.BadParameter(f"{where}: id must be a non-empty string or an integer, got "
                                     f"{body['id']!r}", param_hint="--input")
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
    return requests


def _pending(requests: list[tuple[str, dict[str, Any]]], target: Any,
             run: dict[str, Any] | None = None) -> list[tuple[str, dict[str, Any]]]:
    """The requests the output does not answer yet (a changed request under a finished id is an
    error naming the id; with `run`, results written by another model or decode record are an
    error naming what changed)."""
    from dllm_decode.eval.harness.records import read_records

    try:
        done = {str(r.get("id")): r for r in read_records(target) if isinstance(r, dict)}
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--output") from None
    if run is not None:
        _same_run(done.values(), run, target)
    for request_id, body in requests:
        if request_id in done and not _same_request(done[request_id], body):
            raise click.BadParameter(
                f"request {request_id!r} changed since its result was written to the output (same "
                f"id, another request); give it a new id, or remove its line from the output to "
                f"decode it again", param_hint="--input")
    return [(i, body) for i, body in requests if i not in done]


def _same_run(records: Any, run: dict[str, Any], target: Any) -> None:
    """Refuse an output written by another run (model or decode record), naming what changed."""
    from dllm_decode.runkey import check_resume

    seen: list[Any] = []
    for record in records:
        recorded = record.get("run")
        if recorded is None and "model" in record:       # written before runs were recorded
            recorded = {"model": {**run["model"], "name": record["model"]}}
        if recorded is None or recorded in seen:
            continue
        seen.append(recorded)
        try:
            check_resume(recorded, run, f"the output {str(target)!r}",
                         "choose another --output (or remove it to start again)")
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--output") from None


def _same_request(record: dict[str, Any], body: dict[str, Any]) -> bool:
    """Whether a written result answers this request line (its hash; results written before
    hashes were recorded: the prompt)."""
    if "request_hash" in record:
        return record["request_hash"] == request_hash(body)
    return record.get("prompt") == body.get("prompt")


def run_requests(model: Any, config: Any, requests: list[tuple[str, dict[str, Any]]], output_path: str,
                 chat_template: bool, batch_size: int, model_name: str, groups: Any = None,
                 capture: str = "off", load: dict[str, Any] | None = None) -> None:
    """Decode the requests with the engine and append each result when it finishes, holding the
    output's writer lock throughout; requests another run finished since `read_requests` are
    skipped. `capture` (`--compile` / `--cuda-graphs`) is the engine's step runtime: its graphs
    are made once per bucket and reused by every batch of the file. `load`
    (`runkey.load_identity`) joins the model identity the results are recorded with.

    Under tensor parallelism (`groups` of a world > 1) every rank calls this with the requests of
    the same file: TP rank 0 takes the lock, finds what is left to do and publishes those ids;
    the other ranks decode exactly those, in the same order, and write nothing.

    Raises:
        click.ClickException: another run holds the output, or a result cannot be written.
    """
    from dllm_decode.outputs import OutputError
    from dllm_decode.runkey import model_identity, run_record

    run = run_record({**model_identity(model_name), **(load or {})}, config)
    channel = None
    if groups is not None and groups.world > 1:
        from dllm_decode.parallel.control import ControlChannel

        channel = ControlChannel(groups)
        if not channel.leads:
            ids = set(channel.receive())
            _run(model, config, [(i, body) for i, body in requests if i in ids], None,
                 chat_template, batch_size, model_name, capture)
            return
    try:
        with _owned(output_path):
            todo = _pending(list(requests), output_path, run)
            if channel is not None:
                channel.publish([i for i, _ in todo])
            _run(model, config, todo, output_path, chat_template, batch_size, model_name, capture, run)
    except OutputError as err:
        raise click.ClickException(str(err)) from None


def _run(model: Any, config: Any, requests: list[tuple[str, dict[str, Any]]], output_path: str | None,
         chat_template: bool, batch_size: int, model_name: str, capture: str = "off",
         run: dict[str, Any] | None = None) -> None:
    """Decode `requests`; append each result to `output_path` (None: a follower rank, which
    decodes the same steps and writes nothing)."""
    from dllm_decode.engine import Engine, Request
    from dllm_decode.eval.harness.records import append_records, repair
    from dllm_decode.outputs import describe
    from dllm_decode.serve.protocol import APIError, Settings, parse_job

    tokenizer = getattr(model, "tokenizer", None)
    settings = Settings(model_id=model_name, config=config, max_tokens=sys.maxsize,
                        chat_template=chat_template)
    engine = Engine(model, tokenizer, max_batch_size=batch_size, capture=capture)
    prompts: dict[str, str] = {}
    configs: dict[str, Any] = {}
    hashes: dict[str, str] = {}
    warnings: dict[str, str] = {}
    for request_id, body in requests:             # every line checked before decoding starts
        chat = {"messages": [{"role": "user", "content": body["prompt"]}],
                **{k: v for k, v in body.items() if k != "prompt"}}
        try:
            job = parse_job("chat", chat, settings, tokenizer)
            request = Request(request_id, job.prompt, job.config, job.max_tokens)
            engine.check(request)
        except (APIError, ValueError, TypeError) as err:
            raise click.BadParameter(f"request {request_id!r}: {err}", param_hint="--input") from None
        engine.add(request)
        prompts[request_id], configs[request_id] = body["prompt"], job.config
        hashes[request_id] = request_hash(body)
        if job.warning:
            warnings[request_id] = job.warning
            if output_path is not None:
                click.echo(f"warning: request {request_id!r}: {job.warning}", err=True)
    if output_path is None:
        while engine.has_work:
            engine.step()
        return
    try:
        repair(output_path)
    except OSError as err:
        raise click.ClickException(f"cannot write {output_path!r}: {describe(err)}") from None
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
                         "config": configs[update.request_id].to_dict(),
                         "request_hash": hashes[update.request_id], "run": run,
                         **({"warning": warnings[update.request_id]}
                            if update.request_id in warnings else {})})
        try:
            append_records(output_path, rows)
        except OSError as err:
            raise click.ClickException(
                f"cannot write results to {output_path!r}: {describe(err)} ({finished} result(s) "
                f"written before; a re-run resumes after them)") from None
        finished += len(rows)
    click.echo(f"{finished} request(s) written to {output_path}", err=True)


def stream_one(model: Any, config: Any, prompt: str, capture: str = "off") -> None:
    """Decode one prompt and print its answer as it becomes final (`capture`: the step runtime)."""
    from dllm_decode.engine import Engine, Request
    from dllm_decode.cli.options import usage_errors
    from dllm_decode.prompts import encode_prompts

    tokenizer = getattr(model, "tokenizer", None)
    engine = Engine(model, tokenizer, max_batch_size=1, capture=capture)
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
