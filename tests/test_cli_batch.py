"""`dllm-decode --input/--output` (a JSONL of requests, resumable) and `--stream`."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dllm_decode.cli import main

EMBEDDED = ["--model", "embedded", "--gen-length", "16", "--block-length", "8"]


def run(*args, stdin=None):
    return CliRunner().invoke(main, list(args), input=stdin)


def write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_requests_file_equals_one_by_one_decoding_and_resumes(tmp_path):
    prompts = ["sort : mia ella hank", "copy : tom ann", "sort : bob al sue tina"]
    src, out = tmp_path / "in.jsonl", tmp_path / "out" / "results.jsonl"
    write(src, [{"id": "a", "prompt": prompts[0]}, {"prompt": prompts[1], "max_tokens": 1},
                {"id": "c", "prompt": prompts[2], "dllm": {"scheduler": "low_confidence"}}])
    result = run(*EMBEDDED, "--input", str(src), "--output", str(out), "--batch-size", "2")
    assert result.exit_code == 0, result.output
    rows = {r["id"]: r for r in records(out)}
    assert sorted(rows) == ["2", "a", "c"]
    singles = [json.loads(run(*EMBEDDED, "--prompt", p, "--json", *extra).output)["text"]
               for p, extra in zip(prompts, ([], [], ["--scheduler", "low_confidence"]))]
    assert rows["a"]["text"] == singles[0] and rows["c"]["text"] == singles[2]
    assert rows["2"]["text"] == singles[1].split()[0] and rows["2"]["finish_reason"] == "length"
    assert rows["c"]["config"]["scheduler"]["name"] == "low_confidence"
    # a torn last line and a new request: the re-run keeps the finished ones and adds the new one
    out.write_text(out.read_text() + '{"id": "torn"')
    write(src, [{"id": "a", "prompt": prompts[0]}, {"prompt": prompts[1], "max_tokens": 1},
                {"id": "c", "prompt": prompts[2], "dllm": {"scheduler": "low_confidence"}},
                {"id": "d", "prompt": "copy : al"}])
    again = run(*EMBEDDED, "--input", str(src), "--output", str(out))
    assert again.exit_code == 0, again.output
    assert [r["id"] for r in records(out)][3:] == ["d"] and len(records(out)) == 4


@pytest.mark.parametrize("rows, fragment", [
    (["{not json"], "in.jsonl:1 is not valid JSON"),
    ([{"id": "a"}], "needs an object with a string `prompt`"),
    ([{"prompt": "x", "colour": 1}], "unknown key(s) ['colour']"),
    ([{"id": 1, "prompt": "x"}, {"id": "1", "prompt": "y"}], "id '1' repeats"),
    ([{"prompt": "sort : mia", "dllm": {"scheduler": "nope"}}], "unknown scheduler 'nope'"),
    ([{"prompt": "   "}], "the prompt is empty"),
    ([], "holds no requests"),
])
def test_bad_request_files_are_usage_errors(tmp_path, rows, fragment):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write(src, rows)
    result = run(*EMBEDDED, "--input", str(src), "--output", str(out))
    assert result.exit_code == 2 and fragment in result.output, result.output
    assert "Traceback" not in result.output and not out.exists()


def test_option_combinations_are_checked_before_work(tmp_path):
    src = tmp_path / "in.jsonl"
    write(src, [{"prompt": "x"}])
    assert "go together" in run(*EMBEDDED, "--input", str(src)).output
    assert "--input takes no" in run(*EMBEDDED, "--input", str(src), "--output", str(tmp_path / "o"),
                                     "--stream").output
    blocked = tmp_path / "dir.jsonl"
    blocked.mkdir()
    result = run(*EMBEDDED, "--input", str(src), "--output", str(blocked))
    assert result.exit_code == 2 and "is a directory" in result.output


def test_stream_prints_the_same_answer():
    whole = run(*EMBEDDED, "--prompt", "sort : mia ella hank", "--scheduler", "low_confidence")
    streamed = run(*EMBEDDED, "--prompt", "sort : mia ella hank", "--scheduler", "low_confidence", "--stream")
    assert streamed.exit_code == 0, streamed.output
    assert streamed.output == whole.output == "ella hank mia\n"
