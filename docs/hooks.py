"""MkDocs hook: pages hold `<!-- generated: NAME -->` markers that are replaced at build time by
text computed from the code and the measurement files, so the docs cannot drift from them.

* `compatibility`: scheduler x cache, scheduler x model family, cache x model family,
  self-decoder x model family and self-decoder x cache, each cell a real tiny decode
  (`dllm_decode.compat.matrix`).
* `components`: every registered scheduler, cache and filter with its fields and defaults (the
  registries, as `dllm-decode list` prints them).
* `results`: every measurement file under `measurements/` with its machine, date, commit,
  sample size, interval and command (`measurement_rows`).

It also makes mkdocs-click print an option given no default as what the command takes when the
option is absent (`click_default`), not click 8.5's `Sentinel.UNSET` marker.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MEASUREMENTS = ROOT / "measurements"
MARKER = re.compile(r"<!-- generated: ([a-z_]+) -->")
FIELDS = ("machine", "date", "commit", "samples", "interval", "command")
_cache: dict[str, str] = {}


def click_default(option: Any) -> Any:
    """The default an option shows in the CLI reference: its own, or, where click marks it unset
    (click >= 8.5), `False` for an on/off flag and `None` for the rest."""
    try:
        from click.core import UNSET
    except ImportError:                       # click < 8.5 has no marker
        return option.default
    if option.default is not UNSET:
        return option.default
    return False if option.is_flag and not option.count else None


def _show_click_defaults() -> None:
    try:
        from mkdocs_click import _docs
    except ImportError:
        return
    original = getattr(_docs._format_table_option_row, "__wrapped__", _docs._format_table_option_row)

    def row(option: Any) -> str:
        import copy

        shown = copy.copy(option)
        shown.default = click_default(option)
        return original(shown)

    row.__wrapped__ = original                # type: ignore[attr-defined]
    _docs._format_table_option_row = row


_show_click_defaults()


def on_page_markdown(markdown: str, page: Any = None, config: Any = None, files: Any = None) -> str:
    return MARKER.sub(lambda m: generated(m.group(1)), markdown)


def generated(name: str) -> str:
    if name not in _cache:
        builders = {"compatibility": compatibility, "components": components, "results": results}
        if name not in builders:
            raise ValueError(f"unknown generated section {name!r}; known: {sorted(builders)}")
        import logging
        import time

        log = logging.getLogger("mkdocs.hooks")      # mkdocs prints its INFO lines: never silent
        started = time.perf_counter()
        log.info(f"generating the {name} section" + (" (a real tiny decode per cell; a few minutes)"
                                                      if name == "compatibility" else ""))
        _cache[name] = builders[name]()
        log.info(f"generated the {name} section in {time.perf_counter() - started:.0f} s")
    return _cache[name]


# --- compatibility ---------------------------------------------------------------------------


def compatibility() -> str:
    from dllm_decode.compat import FAMILIES, markdown, matrix

    tables = matrix()
    families = "\n".join(f"* `{key}`: {what}" for key, (what, _) in FAMILIES.items())
    out = [f"Model families (columns below):\n\n{families}\n"]
    for title, cells in tables.items():
        out.append(f"### {title.capitalize()}\n\n{markdown(cells)}")
    return "\n".join(out)


# --- components ------------------------------------------------------------------------------


def components() -> str:
    from dllm_decode.registry import describe, registry

    out = []
    for title, kind in (("Schedulers", "scheduler"), ("Caches", "cache"), ("Filters", "filter"),
                        ("AR draft-length rules", "draft_length"), ("Attention back ends", "attention"),
                        ("Self-speculative decoders (`--self-decoder`)", "self_decoder")):
        out += [f"### {title}", "", "| name | what | fields (defaults) |", "|---|---|---|"]
        for name, doc, params in describe(registry(kind)):
            fields = ", ".join(f"`{f}={default!r}`" for f, _, default in params) or "–"
            out.append(f"| `{name}` | {doc.replace('|', '/')} | {fields.replace('|', '/')} |")
        out.append("")
    return "\n".join(out)


# --- results ---------------------------------------------------------------------------------


def _first(data: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if data.get(key) not in (None, ""):
            return data[key]
    return None


def measurement_rows(root: Path = MEASUREMENTS) -> list[dict[str, Any]]:
    """One row per measurement file (`*.json`, and `*.txt` without a JSON twin): its fields from
    the folder's `index.json` entry for that file when there is one, else from the file's own
    keys (`machine`/`device`/`device_name`, `date`, `commit`, `samples`/`repeats`, `interval`,
    `command`); the date defaults to the folder name's `_YYYY-MM-DD` suffix. Missing: None."""
    rows = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        index_path = folder / "index.json"
        index = json.loads(index_path.read_text()) if index_path.is_file() else {}
        defaults = index.get("defaults", {})
        date = re.search(r"(\d{4}-\d{2}-\d{2})", folder.name)
        files = sorted(p for p in folder.iterdir() if p.suffix in (".json", ".txt") and p.name != "index.json")
        stems_with_json = {p.stem for p in files if p.suffix == ".json"}
        for path in files:
            if path.suffix == ".txt" and path.stem in stems_with_json:
                continue
            data: dict[str, Any] = {}
            if path.suffix == ".json":
                try:
                    loaded = json.loads(path.read_text())
                    data = loaded if isinstance(loaded, dict) else {}
                except json.JSONDecodeError:
                    data = {}
            entry = {**defaults, **index.get("files", {}).get(path.name, {})}
            row = {"folder": folder.name, "file": path.name,
                   "machine": _first(entry, "machine") or _first(data, "machine", "device_name", "device"),
                   "date": _first(entry, "date") or _first(data, "date") or (date.group(1) if date else None),
                   "commit": _first(entry, "commit") or _first(data, "commit"),
                   "samples": _first(entry, "samples") or _first(data, "samples", "repeats"),
                   "interval": _first(entry, "interval") or _first(data, "interval", "ci95"),
                   "command": _first(entry, "command") or _first(data, "command")}
            twin = path.with_suffix(".txt")
            row["text"] = twin.read_text() if twin.is_file() else (path.read_text() if path.suffix == ".txt" else "")
            rows.append(row)
    return rows


def nested_folders(root: Path = MEASUREMENTS) -> list[tuple[str, str]]:
    """(path, title) of every folder below a measurement folder that has its own README.md: its
    files are described there (the title is the README's first heading)."""
    out = []
    for readme in sorted(root.glob("*/*/**/README.md")) if root.is_dir() else []:
        first = next((line.lstrip("# ").strip() for line in readme.read_text().splitlines() if line.strip()), "")
        out.append((readme.parent.relative_to(root.parent).as_posix(), first))
    return out


def results() -> str:
    rows = measurement_rows()
    if not rows:
        return "No measurement files yet.\n"
    nested = nested_folders()
    # the command is long: it goes under each file's heading below, so the table's columns (the
    # file names above all) keep their width instead of breaking every few characters
    out = ["| file | machine | date | commit | sample size | interval |", "|---|---|---|---|---|---|"]
    for row in rows:
        cells = [f"[`{row['folder']}/{row['file']}`](#{_anchor(row)})"]
        for key in FIELDS[:-1]:
            value = row[key]
            text = "–" if value is None else str(value)
            cells.append(f"`{text}`" if key == "commit" and value is not None else text)
        out.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    out.append("")
    if nested:
        out += ["Folders with their own README (their files are described there):", ""]
        out += [f"* `{path}/`: {title}" for path, title in nested]
        out.append("")
    for row in rows:
        if not (row["text"].strip() or row["command"]):
            continue
        out += [f"#### `{row['folder']}/{row['file']}` {{#{_anchor(row)}}}", ""]
        if row["command"]:
            out += ["```bash", str(row["command"]), "```", ""]
        if row["text"].strip():
            out += ["```text", row["text"].rstrip(), "```", ""]
    return "\n".join(out)


def _anchor(row: dict[str, Any]) -> str:
    return "m-" + re.sub(r"[^a-z0-9]+", "-", f"{row['folder']}-{row['file']}".lower()).strip("-")
