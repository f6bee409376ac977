"""Inline component options: the `key=value,...` text after `NAME:` on the command line
(`--scheduler`, `--cache`, `--filter`, `--attention`, `--self-decoder`, `--model ideal:`)."""

from __future__ import annotations


def parse_options(text: str) -> tuple[tuple[str, str], ...]:
    """`key=value,key=value` -> ((key, value), ...) in order. An item without `=` continues the
    value before it, so a value that holds commas (a list field, `es`'s proportions
    `1@0,0.5@0.125`) can be given inline: `ids=5,6,window=2` -> (("ids", "5,6"), ("window", "2")).

    Raises:
        ValueError: a first item without `=`, an empty key, a key given twice (the later value
            would silently replace the earlier), or the key `name` (the name precedes the `:`).
    """
    out: list[list[str]] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep and out:
            out[-1][1] += "," + item
            continue
        if not sep or not key.strip():
            raise ValueError(f"option {item!r} must be key=value")
        if key.strip() == "name":
            raise ValueError("option 'name' is not a field: the name goes before the ':' (NAME:key=value,...)")
        if key.strip() in [k for k, _ in out]:
            raise ValueError(f"option {key.strip()!r} is given twice; give it once")
        out.append([key.strip(), value.strip()])
    return tuple((k, v) for k, v in out)
