"""Read a task prompt back into its task name and `meta` (what the ideal model needs)."""

from __future__ import annotations

from typing import Any

_INDEX_OPS = {"insert": "insert_index", "remove": "remove_index", "replace": "replace_index"}


def parse_prompt(prompt: str) -> tuple[str, dict[str, Any]]:
    """`insert dave at 2 : alice bob` -> ("insert_index", {"items": [...], "word": "dave", "index": 2}).

    Raises:
        ValueError: the text is not a prompt of this package's format.
    """
    head, sep, tail = prompt.partition(" : ")
    words, items = head.split(), tail.split()
    if not sep or not words:
        raise ValueError(f"not a task prompt (expected '<op> ... : <items>'): {prompt!r}")
    op, args = words[0], words[1:]
    if op == "latin":
        return "latin_square", {"symbols": items}
    if op == "sudoku":
        return "sudoku", {"puzzle": [int(d) for d in items]}
    if op in ("copy", "sort", "reverse", "shuffle") and not args:
        return op, {"items": items, "word": None, "index": None}
    index = int(args[args.index("at") + 1]) if "at" in args else None
    if op == "insert" and args:
        word = args[0]
    elif op == "replace" and "with" in args:
        word = args[args.index("with") + 1]
    elif op == "remove":
        word = None
    else:
        raise ValueError(f"not a task prompt: {prompt!r}")
    name = _INDEX_OPS[op] if index is not None else f"{op}_random"
    return name, {"items": items, "word": word, "index": index}
