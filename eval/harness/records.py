"""The per-sample results file: append-only JSONL that survives being killed mid-write.

Each finished batch is appended with one `write` + `flush` + `fsync`, so after a kill at most the
last line is torn. Reading drops a torn (unterminated or undecodable) last line and `repair`
truncates it away before the next append, so a resumed run neither loses a finished sample nor
writes one twice. Sample keys are stable hashes of the configuration plus the example.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def stable_hash(value: Any, length: int = 12) -> str:
    """Hex digest of a JSON-serialisable value, independent of dict order."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def sample_key(config_key: str, task: str, index: int, prompt: str) -> str:
    """One sample's identity: configuration, task, position in the task's list, prompt digest
    (so a changed task generator never resumes from stale samples)."""
    return f"{config_key}|{task}|{index}|{stable_hash(prompt, 8)}"


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Every complete record of a JSONL file (missing file: none). A torn last line is skipped;
    an undecodable line elsewhere is an error, since only the last write can be cut short."""
    path = Path(path)
    if not path.is_file():
        return []
    lines = path.read_bytes().split(b"\n")
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except (json.JSONDecodeError, RecursionError):
            if number == len(lines) and _torn(line):   # unterminated: a write cut short
                break
            raise ValueError(f"{path}:{number} is not valid JSON; only an unterminated last line "
                             f"may be torn, so this file was edited, corrupted or is not a "
                             f"results file") from None
    return records


def _torn(tail: bytes) -> bool:
    """Whether an unterminated last line can be a record cut short: every record is one JSON
    object written with its newline, so a torn one starts with `{` and never ends a line."""
    return tail.lstrip().startswith(b"{")


def repair(path: str | Path) -> int:
    """Cut a torn last line off the file (before appending). Returns the bytes removed."""
    path = Path(path)
    if not path.is_file():
        return 0
    data = path.read_bytes()
    keep = len(data)
    # only an unterminated record is cut: a terminated line, or a tail that is not the start of
    # a record, was not written by a torn append (cutting it would destroy another file's text)
    if data and not data.endswith(b"\n") and _torn(data[data.rfind(b"\n") + 1:]):
        keep = data.rfind(b"\n") + 1
    if keep < len(data):
        with path.open("r+b") as handle:
            handle.truncate(keep)
    return len(data) - keep


def append_records(path: str | Path, records: Iterable[dict[str, Any]]) -> None:
    """Append records as JSON lines in one write, flushed and fsynced."""
    text = "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in records)
    if not text:
        return
    with Path(path).open("a", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def unique_by_key(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """First record of each `key`, in order (merging shards never double-counts a sample)."""
    seen: set[str] = set()
    out = []
    for record in records:
        if record["key"] not in seen:
            seen.add(record["key"])
            out.append(record)
    return out


SAMPLES = "samples.jsonl"
"""The records file of an evaluation directory (rank shards are merged into it)."""


def combined_records(out_dir: str | Path) -> list[dict[str, Any]]:
    """Every finished sample in `out_dir`, labels prefixed by their model when several share it
    (a dLLM run and an `ar:` run of the same tasks, summarized together)."""
    records = unique_by_key(read_records(Path(out_dir) / SAMPLES))
    if len({r["model"] for r in records}) < 2:
        return records
    return [{**r, "label": f"{r['model']} {r['label']}", "group": f"{r['model']} {r['group']}"}
            for r in records]
