"""`dllm_decode.eval.harness.runner.evaluate` end to end on small grids: results, resume after a kill, summary numbers
recomputed from samples.jsonl, ParallelBench's released layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dllm_decode.eval.harness.grid import expand_grid
from dllm_decode.eval.harness.records import read_records
from dllm_decode.eval.harness.report import write_outputs
from dllm_decode.eval.harness.runner import SAMPLES, diffusion_decoder, evaluate
from dllm_decode.eval.tasks.sources import select_tasks
from dllm_decode.eval.harness.summary import summarize
from tests.eval.harness.answer_key import AnswerKeyModel

GEN = 8


def _wrong(index: int) -> bool:
    return index % 3 == 0            # the key model answers these wrongly


def _model(runs) -> AnswerKeyModel:
    answers = {}
    for run in runs:
        for i, ex in enumerate(run.examples):
            answers[ex.prompt] = "alice" if _wrong(i) else ex.answer
    return AnswerKeyModel(answers, GEN)


def _grid():
    return expand_grid([("low_confidence", {}), ("threshold", {})], {},
                       [("tokens_per_step", ["1", "4"]), ("threshold", ["0.5", "0.95"])],
                       gen_length=GEN)


def _counting(decoder):
    calls = []

    def decode(prompts, setting, gen_length, generator):
        calls.append(len(prompts))
        return decoder(prompts, setting, gen_length, generator)
    return decode, calls


def test_grid_end_to_end(tmp_path):
    runs, _ = select_tasks("copy,reverse", limit=3)
    model, settings = _model(runs), _grid()
    assert len(settings) == 4
    records = evaluate(diffusion_decoder(model), "key", settings, runs, tmp_path, batch_size=2)
    assert len(records) == 4 * 2 * 3
    assert len({r["key"] for r in records}) == len(records)
    for r in records:
        assert r["score"] == (0.0 if _wrong(r["index"]) else 1.0), r
        if r["scheduler"] == "low_confidence":      # k tokens per step on an 8-token canvas
            k = r["params"]["tokens_per_step"]
            assert (r["nfe"], r["tokens_per_step"]) == (GEN // k, float(k))
    confident = [r for r in records if r["params"].get("threshold") == 0.5]
    assert all(r["nfe"] == 1 for r in confident)     # 0.9 >= 0.5: the whole canvas in one step
    for r in confident:                              # all finalised at once: AFP = the answer, no order
        assert r["finalized_at"] == [1] * GEN and r["kendall_tau"] is None and r["afp"] >= 1
    for r in records:
        assert len(r["finalized_at"]) == GEN and max(r["finalized_at"]) == r["nfe"]
    summary = write_outputs(records, tmp_path, plots=False)
    assert {round(c["accuracy"], 6) for c in summary["results"]} == {66.666667}   # 2 of 3 right
    assert len(summary["leaderboard"]) == 2
    per_task, order = (tmp_path / "report.md").read_text().split("## Generation order")
    assert per_task.count("| copy | low_confidence |") == 2 and order.count("| copy | low_confidence |") == 2
    assert all(c["afp"] is not None for c in summary["results"])


def test_resume_after_kill_loses_and_duplicates_nothing(tmp_path):
    runs, _ = select_tasks("copy", limit=6)
    model, settings = _model(runs), _grid()[:2]
    decode, calls = _counting(diffusion_decoder(model))
    first = evaluate(decode, "key", settings, runs, tmp_path, batch_size=2)
    assert sum(calls) == 12
    path = tmp_path / SAMPLES
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:5]) + lines[5][: len(lines[5]) // 2])   # killed mid-line
    calls.clear()
    again = evaluate(decode, "key", settings, runs, tmp_path, batch_size=2)
    assert sum(calls) == 7                          # only the torn sample and the unwritten ones
    assert [r["key"] for r in again] == [r["key"] for r in first]
    assert again[:5] == first[:5]                   # finished samples were kept, not redone
    on_disk = read_records(path)
    assert len(on_disk) == len({r["key"] for r in on_disk}) == 12
    calls.clear()
    evaluate(decode, "key", settings, runs, tmp_path, batch_size=2)
    assert calls == []                              # a finished run has nothing left to do


def test_summary_json_recomputes_from_samples(tmp_path):
    runs, _ = select_tasks("copy,sort", limit=4)
    model = _model(runs)
    settings = expand_grid([("random", {})], {}, [("tokens_per_step", ["1", "2", "8"])], gen_length=GEN)
    records = evaluate(diffusion_decoder(model), "key", settings, runs, tmp_path, batch_size=3)
    write_outputs(records, tmp_path, plots=False)
    summary = json.loads((tmp_path / "summary.json").read_text())
    samples = read_records(tmp_path / SAMPLES)
    for cell in summary["results"]:
        rows = [s for s in samples if s["config_key"] == cell["config_key"] and s["task"] == cell["task"]]
        assert cell["samples"] == len(rows) == 4
        assert cell["accuracy"] == pytest.approx(100 * sum(s["score"] for s in rows) / len(rows))
        assert cell["nfe"] == pytest.approx(sum(s["nfe"] for s in rows) / len(rows))
        assert cell["tokens_per_step"] == pytest.approx(GEN / cell["nfe"])
    assert summary == json.loads(json.dumps(write_outputs(samples, tmp_path, plots=False)
                                            | {"plots": summary["plots"]}, default=str))


def _released_fixture(root: Path) -> Path:
    """Two rows per file in the layout ParallelBench ships (72de8f7), with our own names."""
    (root / "waiting_line").mkdir(parents=True)
    (root / "puzzle").mkdir()
    (root / "words_to_sentence").mkdir()
    def lst(items):
        return json.dumps(items).replace('","', '", "')
    rows = {
        "waiting_line/copy.jsonl": [
            {"input": {"context": lst(["alice", "bob", "carol"])}, "answer": lst(["alice", "bob", "carol"])},
            {"input": {"context": lst(["dan", "emma"])}, "answer": lst(["dan", "emma"])}],
        "waiting_line/replace_random.jsonl": [
            {"input": {"context": lst(["alice", "bob"]), "word": "ivan"},
             "answer": {"input": ["alice", "bob"], "word": "ivan", "example": lst(["ivan", "bob"])}}],
        "puzzle/sudoku_n4_12.jsonl": [
            {"input": {"sudoku": "0042\n2031\n4023\n3214"}, "answer": "1342\n2431\n4123\n3214"}],
        "puzzle/latin_square_n4.jsonl": [
            {"input": {"size": 4, "symbols": "[A, B, C, D]"},
             "answer": {"symbols": ["A", "B", "C", "D"], "example": "A,B,C,D\nB,C,D,A\nC,D,A,B\nD,A,B,C"}}],
        "words_to_sentence/easy.jsonl": [
            {"input": {"words": "dog, park, and ball"}, "answer": {"words": ["dog", "park", "ball"]}}],
    }
    for rel, items in rows.items():
        (root / rel).write_text("".join(json.dumps(r) + "\n" for r in items))
    return root


def test_released_layout_through_the_runner(tmp_path):
    directory = _released_fixture(tmp_path / "released")
    runs, skipped = select_tasks(f"released:{directory}")
    names = {run.name for run in runs}
    assert {"released/copy", "released/replace_random", "released/sudoku",
            "released/latin_square"} <= names
    if "released/words_to_sentence/easy" not in names:     # optional scorers absent: a message
        assert any("words_to_sentence/easy" in m and "language_tool_python" in m for m in skipped)
    runs = [r for r in runs if not r.name.startswith("released/words")]
    answers = {ex.prompt: ex.answer for run in runs for ex in run.examples}
    answers[runs[0].examples[1].prompt] = '[ " dan " ]'                 # one wrong copy
    sudoku = next(r for r in runs if r.name == "released/sudoku").examples[0]
    answers[sudoku.prompt] = " ".join(ch for ch in sudoku.answer if ch.isdigit())
    latin = next(r for r in runs if r.name == "released/latin_square").examples[0]
    assert (latin.prompt, latin.meta["symbols"]) == ("latin : A B C D", ["A", "B", "C", "D"])
    runs = [r for r in runs if r.name != "released/latin_square"]    # CSV rows need a newline token
    model = AnswerKeyModel(answers, 48, confidence=0.99)
    settings = expand_grid([("threshold", {})], {}, [], gen_length=48)
    records = evaluate(diffusion_decoder(model), "key", settings, runs, tmp_path / "out", batch_size=4)
    scores = {(r["task"], r["index"]): r["score"] for r in records}
    # The word tokenizer has no newline, so the Sudoku comes out on one line: ParallelBench's
    # scorer (the default) reads a grid only from 4 lines of 4 digits.
    assert scores == {("released/copy", 0): 1.0, ("released/copy", 1): 0.0,
                      ("released/replace_random", 0): 1.0, ("released/sudoku", 0): 0.0}
    summary = summarize(records)
    assert summary["tasks"]["released/sudoku"]["total_correlation_bits"] == 0.0


def test_unknown_selection_and_released_task_are_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown task 'copyy'"):
        select_tasks("copyy")
    directory = _released_fixture(tmp_path / "released")
    with pytest.raises(ValueError, match="not found"):
        select_tasks(f"released:{directory}#shuffle")
    with pytest.raises(ValueError, match="does not exist"):
        select_tasks(f"released:{tmp_path}/nowhere")


def test_a_second_writer_of_the_same_directory_is_refused(tmp_path):
    import subprocess
    import sys

    from dllm_decode.eval.harness.runner import exclusive

    holder = subprocess.Popen([sys.executable, "-c", (
        "import pathlib, sys, time; from dllm_decode.eval.harness.runner import exclusive\n"
        f"with exclusive(pathlib.Path({str(tmp_path)!r}), 0):\n"
        "    print('held', flush=True); time.sleep(30)")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ValueError, match=rf"another evaluation \(pid {holder.pid}\) is writing"):
            with exclusive(tmp_path, 0):
                pass
        with exclusive(tmp_path, 1):                 # another rank of the same run is its own writer
            pass
    finally:
        holder.kill()
        holder.wait()
    with exclusive(tmp_path, 0):                     # released when the holder died
        pass
