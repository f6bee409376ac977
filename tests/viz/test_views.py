"""The terminal animation, the HTML trace and the CLI flags, checked against the raw trace."""

from __future__ import annotations

import json
import os
import pty
import re

import click
import pytest
from click.testing import CliRunner

from dllm_decode.viz.frames import END_OF_TEXT, result_frames, token_labels, used_ids
from dllm_decode.viz.html import result_html
from dllm_decode.viz.terminal import plain_lines, show

from .conftest import PROMPTS, read_screen


def _commits_from_trace(result, row):
    """{position: (step, token)} of row's commits, read straight from the trace tensors."""
    commits, step = {}, 0
    for entry in result.trace:
        hits = (entry["rows"] == row).nonzero()
        if hits.numel() == 0:
            continue
        i, step = int(hits[0, 0]), step + 1
        for j in entry["commit"][i].nonzero().flatten().tolist():
            commits[entry["offset"] + j] = (step, int(entry["tokens"][i, j]))
    return commits


def _page_data(page):
    found = re.search(r'<script id="trace-data" type="application/json">(.*?)</script>', page, re.S)
    return json.loads(found.group(1))


def test_the_views_agree_cell_by_cell_with_the_trace(traced):
    result, tokenizer = traced
    samples = result_frames(result)
    labels = token_labels(tokenizer, used_ids(samples))
    data = _page_data(result_html(result, tokenizer, PROMPTS))
    lines = iter(plain_lines(samples, labels))
    for b, sample in enumerate(samples):
        commits = _commits_from_trace(result, b)
        assert commits, "the trace recorded no commit"
        page = data["samples"][b]
        assert len(page["frames"]) == sample.steps == int(result.nfe[b])
        assert page["text"] == result.text[b]
        for k, frame in enumerate(page["frames"], start=1):
            cells = next(lines).split(" | ", 1)[1].split(" ")
            assert len(cells) == len(frame["tokens"]) == result.tokens.shape[1]
            for p, (code, tok, cell) in enumerate(zip(frame["state"], frame["tokens"], cells)):
                if p in commits and commits[p][0] <= k:          # committed by now, per the trace
                    assert code == "c" and tok == commits[p][1] and cell == labels[tok]
                elif p in commits:                                # not yet: masked or a guess
                    assert code in "mp" and cell == ("_" if code == "m" else "?" + labels[tok])
        assert page["frames"][-1]["tokens"] == result.tokens[b].tolist()
        assert next(lines).startswith("sample")                    # the summary line


def test_the_page_is_self_contained_and_escapes_text(traced):
    result, tokenizer = traced
    page = result.to_html(tokenizer, prompts=["</script><script>alert(1)</script>", "x"])
    assert page == result_html(result, tokenizer, ["</script><script>alert(1)</script>", "x"])
    assert not re.search(r"https?://|\bsrc=|@import", page)
    assert re.findall(r"href=\"([^\"]*)\"", page) == ["data:,"]       # the blank icon only
    assert page.count("</script>") == 2                          # the data block and the code
    assert _page_data(page)["samples"][0]["prompt"].startswith("</script>")


def test_the_animation_on_a_pseudo_terminal(traced):
    result, tokenizer = traced
    samples = result_frames(result)
    labels = token_labels(tokenizer, used_ids(samples))
    leader, follower = pty.openpty()
    with os.fdopen(follower, "w", encoding="utf-8", closefd=True) as out:
        assert out.isatty()
        show(samples, labels, out=out, delay=0)
    screen = read_screen(leader)
    assert "\x1b[" in screen                                       # styled, not plain lines
    assert " | " not in screen
    last = samples[0].steps
    assert f"step {last}/{last}" in screen and "tokens per step" in screen
    for tok in result.tokens[0].tolist()[: int(result.answer_lengths[0])]:
        assert labels[tok] in screen


def test_cli_show_without_a_terminal_prints_lines_then_the_answer(tmp_path):
    from dllm_decode.cli import main

    runner = CliRunner()
    args = ["--prompt", "sort: 5 3 9 1", "--gen-length", "8"]
    plain = runner.invoke(main, args)
    assert plain.exit_code == 0, plain.output
    page = tmp_path / "t.html"
    shown = runner.invoke(main, [*args, "--show", "--trace-html", str(page)])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.strip().splitlines()
    assert lines[0].startswith("step 1/") and lines[-1] == plain.output.strip()
    assert END_OF_TEXT in lines[-3]
    assert _page_data(page.read_text())["samples"][0]["text"] == plain.output.strip()
    assert not list(tmp_path.glob(".*.tmp"))                      # written atomically


@pytest.mark.parametrize("extra, message", [
    (["--show", "--json"], "drop --json"),
    (["--show", "--stream"], "drop --stream"),
    (["--trace-html", "."], "is a directory"),
])
def test_cli_view_conflicts_are_usage_errors(extra, message):
    from dllm_decode.cli import main

    out = CliRunner().invoke(main, ["--prompt", "sort: 1 2", *extra])
    assert out.exit_code == 2 and message in out.output and "Traceback" not in out.output


def test_missing_rich_is_one_line(monkeypatch):
    import sys

    from dllm_decode.viz import cli_views

    monkeypatch.setitem(sys.modules, "rich", None)
    monkeypatch.setattr(cli_views, "_interactive", lambda: True)
    with pytest.raises(click.ClickException, match=r"pip install 'dllm-decode\[viz\]'"):
        cli_views.Views.checked(True, None)
