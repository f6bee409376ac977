"""The JSONL sample store: torn last lines, repair, dedupe."""

import json

import pytest

from dllm_decode.eval.harness.records import append_records, read_records, repair, sample_key, stable_hash, unique_by_key


def test_torn_last_line_is_dropped_and_repaired(tmp_path):
    path = tmp_path / "s.jsonl"
    append_records(path, [{"key": "a", "v": 1}, {"key": "b", "v": 2}])
    with path.open("a") as handle:
        handle.write('{"key": "c", "v"')             # killed mid-write
    assert [r["key"] for r in read_records(path)] == ["a", "b"]
    assert repair(path) == len('{"key": "c", "v"')
    append_records(path, [{"key": "c", "v": 3}])
    assert [r["key"] for r in read_records(path)] == ["a", "b", "c"]
    assert repair(path) == 0


def test_corrupt_middle_line_is_an_error(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text('{"key": "a"}\nnot json\n{"key": "b"}\n')
    with pytest.raises(ValueError, match="s.jsonl:2"):
        read_records(path)


def test_keys_and_dedupe():
    assert stable_hash({"a": 1, "b": 2}) == stable_hash({"b": 2, "a": 1})
    assert sample_key("k", "copy", 0, "p") != sample_key("k", "copy", 0, "q")
    rows = [{"key": "x", "v": 1}, {"key": "y"}, {"key": "x", "v": 2}]
    assert unique_by_key(rows) == [{"key": "x", "v": 1}, {"key": "y"}]
    assert json.dumps(read_records("/nonexistent/file.jsonl")) == "[]"
