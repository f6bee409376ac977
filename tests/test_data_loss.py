"""Nothing lost: outputs are owned (one writer), never the input, resumed by request not just by
id, written atomically, and a full disk or a special file is one clear line with a non-zero exit."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from dllm_decode.cli import main

EMBEDDED = ["--model", "embedded", "--gen-length", "16", "--block-length", "8"]


def run(*args):
    return CliRunner().invoke(main, list(args))


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def one_line_error(result, fragment):
    assert result.exit_code != 0, result.output
    assert fragment in result.output, result.output
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)


# ---- the same file as input and output --------------------------------------------------------

@pytest.mark.parametrize("how", ["same", "symlink", "hardlink", "dotted"])
def test_the_input_file_is_never_the_output(tmp_path, how):
    src = tmp_path / "in.jsonl"
    write(src, [{"id": "a", "prompt": "sort : mia ella"}, {"prompt": "copy : tom"}])
    before = src.read_bytes()
    out = {"same": src, "symlink": tmp_path / "link.jsonl", "hardlink": tmp_path / "hard.jsonl",
           "dotted": tmp_path / "." / "in.jsonl"}[how]
    if how == "symlink":
        os.symlink(src, out)
    if how == "hardlink":
        os.link(src, out)
    result = run(*EMBEDDED, "--input", str(src), "--output", str(out))
    one_line_error(result, "is the --input file")
    assert src.read_bytes() == before


# ---- two writers -------------------------------------------------------------------------------

HOLD = """
import sys, time
from dllm_decode.outputs import output_lock
with output_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_second_batch_run_on_one_output_stops_at_once(tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write(src, [{"id": "a", "prompt": "sort : mia ella"}])
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        result = run(*EMBEDDED, "--input", str(src), "--output", str(out))
        one_line_error(result, f"another process (pid {holder.pid}) is writing")
        assert not out.exists() or out.read_text() == ""
    finally:
        holder.kill()
        holder.wait()
    assert run(*EMBEDDED, "--input", str(src), "--output", str(out)).exit_code == 0   # released
    assert [r["id"] for r in records(out)] == ["a"]


def test_the_lock_is_released_after_a_run_and_after_a_failed_load(tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write(src, [{"id": "a", "prompt": "sort : mia ella"}])
    failed = run("--model", str(tmp_path / "no-such-model"), "--input", str(src), "--output", str(out))
    assert failed.exit_code != 0
    for _ in range(2):
        result = run(*EMBEDDED, "--input", str(src), "--output", str(out))
        assert result.exit_code == 0, result.output
    assert [r["id"] for r in records(out)] == ["a"]                  # written once


# ---- resume keys on the request, not only its id --------------------------------------------

@pytest.mark.parametrize("change", [{"prompt": "sort : hank mia"}, {"max_tokens": 2},
                                    {"dllm": {"scheduler": "low_confidence"}}, {"seed": 7}])
def test_a_changed_request_under_a_finished_id_is_an_error(tmp_path, change):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    first = [{"id": "a", "prompt": "sort : mia ella"}, {"id": "b", "prompt": "copy : tom ann"}]
    write(src, first)
    assert run(*EMBEDDED, "--input", str(src), "--output", str(out)).exit_code == 0
    kept = out.read_bytes()
    write(src, [first[0], {**first[1], **change}])
    result = run(*EMBEDDED, "--input", str(src), "--output", str(out))
    one_line_error(result, "request 'b' changed since its result was written")
    assert out.read_bytes() == kept
    write(src, first + [{"id": "c", "prompt": "sort : al bob"}])      # unchanged: resumes
    assert run(*EMBEDDED, "--input", str(src), "--output", str(out)).exit_code == 0
    assert [r["id"] for r in records(out)][2:] == ["c"]


# ---- full disks and special files --------------------------------------------------------------

def test_a_full_disk_during_a_batch_run_is_one_line_and_exit_1(tmp_path, monkeypatch):
    import dllm_decode.eval.harness.records as records_module

    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write(src, [{"id": "a", "prompt": "sort : mia ella"}, {"id": "b", "prompt": "copy : tom"}])

    def full(path, rows):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(records_module, "append_records", full)
    result = run(*EMBEDDED, "--input", str(src), "--output", str(out))
    assert result.exit_code == 1 and "no space left on device" in result.output, result.output
    assert "a re-run resumes" in result.output and result.exception is None or isinstance(result.exception, SystemExit)


@pytest.mark.parametrize("device", ["/dev/full", "/dev/null"])
def test_special_files_are_refused_before_any_work(tmp_path, device):
    if not os.path.exists(device):
        pytest.skip(f"{device} is missing")
    src = tmp_path / "in.jsonl"
    write(src, [{"prompt": "sort : mia ella"}])
    one_line_error(run(*EMBEDDED, "--input", str(src), "--output", device), "not a regular file")
    one_line_error(run("train-filter", "--out", device, "--per-task", "1", "--epochs", "1"),
                   "not a regular file")


def test_eval_out_empty_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one_line_error(run("eval", "--out", "", "--model", "embedded", "--tasks", "sort", "--limit", "1"),
                   "empty")
    assert list(tmp_path.iterdir()) == []


def test_atomic_writes_keep_the_old_file_on_a_full_disk(tmp_path, monkeypatch):
    from pathlib import Path

    from dllm_decode.outputs import OutputError, atomic_write

    target = tmp_path / "summary.json"
    atomic_write(target, '{"old": 1}\n')
    original = Path.write_bytes

    def full(self, data):
        original(self, data[:3])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", full)
    with pytest.raises(OutputError, match="no space left on device"):
        atomic_write(target, '{"new": 2}\n')
    assert target.read_text() == '{"old": 1}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]          # no temporary left


def test_weights_go_through_a_temporary_file(tmp_path):
    from dllm_decode.filters.mlp import ConfidenceMLP, load_mlp, save_mlp
    from dllm_decode.outputs import OutputError

    target = tmp_path / "filter.safetensors"
    save_mlp(ConfidenceMLP(width=8), target)
    assert load_mlp(str(target)).width == 8 and [p.name for p in tmp_path.iterdir()] == [target.name]
    if os.path.exists("/dev/full"):
        with pytest.raises(OutputError, match="not a regular file"):
            save_mlp(ConfidenceMLP(width=8), "/dev/full")
