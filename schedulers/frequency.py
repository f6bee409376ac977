"""Background unigram frequency tables for PC-Sampler's calibrated confidence: built offline from
a tokenizer and local text, stored as safetensors (never pickle), loaded once per process.

Format on disk: tensors `ids` (int64, distinct token ids), `counts` (int64, their counts) and
`total` (int64, shape (1,), the number of tokens counted N), plus metadata under one key
`frequency_table`, a sorted JSON object (`tokenizer`: the SHA-256 of the tokenizer's vocabulary,
`source`: what was counted). The reference's JSON
(`{"num_token": N, "p_baseline_dict": {id: count}}`, or its builder's `token_frequency_dict`
spelling, which its own loader cannot read) loads too. f(v) = count(v) / N; an id never seen gets
the reference's floor 1/N, or add-k smoothing when asked.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import warnings
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

TABLES_DIR = Path(__file__).resolve().parent.parent / "dllm_decode" / "embedded" / "tables"
META_KEY = "frequency_table"
"""The one metadata entry (a sorted JSON object): safetensors orders several keys arbitrarily, and
one key keeps a rebuilt file byte-identical."""
SHIPPED = {"embedded": "frequency.safetensors"}
"""Tables shipped with the package, by name (the embedded models' shared vocabulary)."""


@dataclass(frozen=True)
class FrequencyTable:
    """Token counts over a text sample: `ids` and `counts` (K,) int64, `total` N."""

    ids: Tensor
    counts: Tensor
    total: int
    metadata: dict[str, str] = field(default_factory=dict)

    def log_frequency(self, vocab_size: int, smoothing: float = 0.0) -> Tensor:
        """(vocab_size,) float32 ln f(v): count / N, unseen ids 1/N (smoothing 0, the reference's
        floor) or (count + k) / (N + k V) with add-k smoothing."""
        if smoothing > 0:
            counts = torch.full((vocab_size,), smoothing, dtype=torch.float64)
            counts.index_add_(0, self.ids, self.counts.double())
            return (counts / (self.total + smoothing * vocab_size)).log().float()
        counts = torch.ones(vocab_size, dtype=torch.float64)
        counts[self.ids] = self.counts.double()
        return (counts / self.total).log().float()

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({"ids": self.ids.contiguous(), "counts": self.counts.contiguous(),
                   "total": torch.tensor([self.total], dtype=torch.long)}, str(path),
                  metadata={META_KEY: json.dumps({k: str(v) for k, v in self.metadata.items()}, sort_keys=True)})
        return path


def vocabulary_hash(tokenizer: Any) -> str:
    """SHA-256 of the tokenizer's token -> id map (sorted JSON): which vocabulary a table counts."""
    vocab = tokenizer.get_vocab()
    return hashlib.sha256(json.dumps(sorted(vocab.items()), ensure_ascii=False).encode()).hexdigest()


def _encode(tokenizer: Any, text: str) -> list[int]:
    encoded = tokenizer.encode(text, add_special_tokens=False)
    return list(getattr(encoded, "ids", encoded))


def build_frequency_table(tokenizer: Any, texts: Iterable[str], source: str = "") -> FrequencyTable:
    """Count `tokenizer.encode(text, add_special_tokens=False)` over `texts` (as the reference's
    `calculate_p_baseline.py`). Downloads nothing; `source` says what the texts were."""
    counter: Counter[int] = Counter()
    for text in texts:
        counter.update(_encode(tokenizer, text))
    if not counter:
        raise ValueError("no tokens counted: give at least one non-empty text")
    ids = sorted(counter)
    return FrequencyTable(torch.tensor(ids, dtype=torch.long),
                          torch.tensor([counter[i] for i in ids], dtype=torch.long),
                          sum(counter.values()), {"tokenizer": vocabulary_hash(tokenizer), "source": source,
                                                  "vocab_size": str(len(tokenizer.get_vocab()))})


def read_table(path: str | Path) -> FrequencyTable:
    """A table from a `.safetensors` file or the reference's JSON (either key spelling).

    Raises:
        ValueError: one line naming the file: missing, not a regular file, or not a table (corrupt,
            cut short, nested too deeply, missing keys, wrong types).
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"frequency table {str(path)!r} not found; give a shipped name "
                         f"({', '.join(sorted(SHIPPED))}) or a .safetensors/.json file")
    try:
        return _read_table(path)
    except ValueError:
        raise
    except Exception as err:  # noqa: BLE001 - any reader failure is a bad file, in one line
        text = str(err).strip().splitlines()
        raise ValueError(f"{path} is not a frequency table ({text[0] if text else type(err).__name__})") from None


def _read_table(path: Path) -> FrequencyTable:
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        counts = data.get("p_baseline_dict", data.get("token_frequency_dict"))
        if not isinstance(counts, dict) or "num_token" not in data:
            raise ValueError(f"{path}: expected keys 'num_token' and 'p_baseline_dict' "
                             f"(or 'token_frequency_dict')")
        ids = sorted(int(i) for i in counts)
        return FrequencyTable(torch.tensor(ids, dtype=torch.long),
                              torch.tensor([int(counts[str(i)] if str(i) in counts else counts[i]) for i in ids],
                                           dtype=torch.long), int(data["num_token"]), {"source": str(path)})
    from safetensors import safe_open
    with safe_open(str(path), "pt") as handle:
        metadata = dict(handle.metadata() or {})
    if META_KEY in metadata:
        metadata = json.loads(metadata[META_KEY])
    tensors = load_file(str(path))
    return FrequencyTable(tensors["ids"], tensors["counts"], int(tensors["total"][0]), metadata)


def resolve_table(name: str) -> Path:
    """The file of a shipped table name, or `name` as a path."""
    return TABLES_DIR / SHIPPED[name] if name in SHIPPED else Path(name)


UNIFORM = "uniform"
"""The table name that needs no file: f(v) = 1/V for every id of any vocabulary (PC-Sampler then
ranks by confidence alone, up to the clip)."""
AUTO = "auto"
"""The shipped table built for a vocabulary of the model's size, else `uniform` (with a warning)."""


def resolve_name(name: str, vocab_size: int) -> str:
    """`auto` -> the shipped table recorded for `vocab_size` ids, or `uniform`; other names as given."""
    if name != AUTO:
        return name
    for shipped in sorted(SHIPPED):
        if _table(shipped).metadata.get("vocab_size") == str(vocab_size):
            return shipped
    return UNIFORM


def check_table(name: str, vocab_size: int) -> None:
    """Raise a one-line `ValueError` when the table cannot serve a vocabulary of `vocab_size`
    (it names ids outside it, or records another vocabulary size); warn when `auto` finds no
    shipped table for it and runs uniform."""
    resolved = resolve_name(name, vocab_size)
    if resolved == UNIFORM:
        if name == AUTO:
            warnings.warn(f"no shipped frequency table for a vocabulary of {vocab_size}: PC-Sampler runs "
                          f"uncalibrated (uniform table); build one for this tokenizer with "
                          f"dllm_decode.schedulers.frequency.build_frequency_table", stacklevel=2)
        return
    table = _table(resolved)
    recorded = table.metadata.get("vocab_size")
    if len(table.ids) and int(table.ids.max()) >= vocab_size or recorded not in (None, str(vocab_size)):
        raise ValueError(f"frequency table {name!r} was built for another vocabulary (ids up to "
                         f"{int(table.ids.max())}, {recorded or 'unrecorded'} tokens; the model has "
                         f"{vocab_size}); build one for this tokenizer "
                         f"(dllm_decode.schedulers.frequency.build_frequency_table) or use 'uniform'")


@functools.lru_cache(maxsize=8)
def _table(name: str) -> FrequencyTable:
    return read_table(resolve_table(name))


@functools.lru_cache(maxsize=8)
def log_frequency(name: str, vocab_size: int, smoothing: float, device: str) -> Tensor:
    """Dense (vocab_size,) ln f for a table name or path, cached per (table, vocabulary size,
    smoothing, device): loaded once, never instance state, several tables side by side. Ids at or
    past `vocab_size` are dropped here; `check_table` refuses such a table before a request."""
    name = resolve_name(name, vocab_size)
    if name == UNIFORM:
        return torch.full((vocab_size,), -math.log(vocab_size), device=device)
    table = _table(name)
    keep = table.ids < vocab_size
    part = FrequencyTable(table.ids[keep], table.counts[keep], table.total, table.metadata)
    return part.log_frequency(vocab_size, smoothing).to(device)
