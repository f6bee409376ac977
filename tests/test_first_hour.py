"""What a new user meets in the first hour: the model's own canvas, accepted values read from
the registries and the model, progress off a terminal, the plot notice, a report that records
the command as typed, the lm-eval task folder, a clean wheel build."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from dllm_decode.cli import main
from dllm_decode.registry import registry

PROMPT = "sort : mia ella hank"


def _invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def test_the_embedded_model_decodes_on_its_own_canvas():
    result = _invoke("--json", "--prompt", PROMPT)
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["text"] == "ella hank mia"
    assert len(out["tokens"]) == 32 and out["config"]["gen_length"] == 32   # not 128
    assert out["tokens_per_step"] == 32.0


def test_gen_length_overrides_the_models_canvas():
    out = json.loads(_invoke("--json", "--gen-length", "64", "--prompt", PROMPT).output)
    assert len(out["tokens"]) == 64 and out["config"]["block_length"] == 32


def test_a_model_without_a_declared_length_keeps_the_fallback():
    from dllm_decode.cli.decode import FALLBACK_GEN_LENGTH
    from dllm_decode.cli.options import natural_gen_length
    from dllm_decode.models import load_model
    from dllm_decode.testing import tiny_llada_with_tokenizer

    assert natural_gen_length(tiny_llada_with_tokenizer()) is None
    assert natural_gen_length(load_model("embedded")) == 32
    assert natural_gen_length(load_model("embedded-bd")) == 32
    out = json.loads(_invoke("--model", "tiny", "--json", "--prompt", "w1 w2").output)
    assert len(out["tokens"]) == FALLBACK_GEN_LENGTH


def _help_text() -> str:
    return " ".join(_invoke("--help").output.split())


@pytest.mark.parametrize("kind", ["scheduler", "cache", "filter"])
def test_help_lists_every_registered_name(kind):
    text = _help_text()
    names = ", ".join(registry(kind))
    assert names in text, f"{kind}: {names!r} not in --help"


def test_eval_help_lists_them_too():
    text = " ".join(_invoke("eval", "--help").output.split())
    for kind in ("scheduler", "cache", "filter"):
        assert ", ".join(registry(kind)) in text, kind


def test_help_follows_the_registry(monkeypatch):
    from dllm_decode.caches import CACHES, PrefixCache

    monkeypatch.setitem(CACHES, "my_cache", PrefixCache)
    assert ", ".join(list(CACHES)[-3:]).endswith("my_cache") and ", ".join(list(CACHES)[-3:]) in _help_text()


def test_a_cache_the_model_refuses_names_the_ones_it_accepts():
    from dllm_decode.compat import accepted_caches
    from dllm_decode.models import load_model

    result = _invoke("--cache", "block", "--prompt", PROMPT)
    assert result.exit_code == 2
    accepted = accepted_caches(load_model("embedded"))
    assert len(accepted) >= 6 and "block" not in accepted
    assert f"accepted caches for this model: {', '.join(accepted)}" in result.output
    assert "Traceback" not in result.output


def test_progress_off_a_terminal_is_periodic_log_lines():
    from dllm_decode.eval.harness.progress import Progress

    stream = io.StringIO()
    progress = Progress(4, label="eval x", stream=stream, log_every=0.0)
    assert progress.bar is None                       # not a terminal: no redrawn bar
    progress.update([1.0, 0.0])
    progress.update([1.0, 1.0])
    progress.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and "\r" not in stream.getvalue()
    assert lines[0].startswith("eval x:") and "2/4" in lines[0] and "acc 50.0%" in lines[0]
    assert "4/4" in lines[1] and "acc 75.0%" in lines[1]


def test_progress_speaks_while_a_long_batch_runs():
    """A batch that takes longer than the log interval still gets its line, and the time left
    follows the whole run's rate (it grows while nothing finishes)."""
    import time

    from dllm_decode.eval.harness.progress import Progress

    stream = io.StringIO()
    progress = Progress(4, label="eval x", stream=stream, log_every=1.0)
    progress.update([1.0])
    time.sleep(2.5)                                  # the next batch is slow: no update
    progress.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) >= 2 and all("1/4" in line for line in lines)
    left = [line.split("<")[1].split(",")[0] for line in lines]     # tqdm's [elapsed<left, ...]
    assert left == sorted(left) and left[0] != left[-1]


def test_progress_stays_quiet_for_a_short_run_and_uses_tqdm_on_a_terminal():
    from dllm_decode.eval.harness.progress import Progress

    quiet = io.StringIO()
    progress = Progress(2, stream=quiet, log_every=60.0)
    progress.update([1.0, 1.0])
    assert quiet.getvalue() == ""

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    shown = Terminal()
    bar = Progress(2, stream=shown)
    bar.update([1.0])
    bar.update([0.0])
    bar.close()
    assert bar.bar is not None and "2/2" in shown.getvalue() and "acc 50.0%" in shown.getvalue()


def test_eval_says_when_plots_are_skipped(tmp_path, monkeypatch):
    from dllm_decode.eval.harness import plots
    from dllm_decode.eval.harness.report import PLOTS_SKIPPED

    monkeypatch.setattr(plots, "available", lambda: False)
    result = _invoke("eval", "--model", "embedded", "--tasks", "copy", "--limit", "2",
                     "--out", str(tmp_path), "--no-progress")
    assert result.exit_code == 0, result.output
    assert PLOTS_SKIPPED in result.output
    assert PLOTS_SKIPPED in (tmp_path / "report.md").read_text()
    assert not list(tmp_path.glob("*.png"))


def test_the_report_records_the_command_as_typed(monkeypatch):
    from dllm_decode.cli.evaluate import command_line

    monkeypatch.setattr(sys, "argv", ["/home/u/project/.venv/bin/dllm-decode", "eval", "--out", "runs/a b"])
    assert command_line() == "dllm-decode eval --out 'runs/a b'"


def test_the_lm_eval_adapter_includes_its_own_task_folder():
    from dllm_decode.eval.harness.lm_eval_adapter import TASKS_DIR, with_task_folder

    assert (TASKS_DIR / "dllm_sort.yaml").is_file()
    argv = with_task_folder(["dllm-lm-eval", "--tasks", "dllm_sort"])
    assert argv[1:3] == ["--include_path", str(TASKS_DIR)] and argv[3:] == ["--tasks", "dllm_sort"]
    mine = ["dllm-lm-eval", "--include_path", "/my/tasks", "--tasks", "x"]
    assert with_task_folder(mine) == mine
    assert with_task_folder(["dllm-lm-eval", "--include_path=/t"]) == ["dllm-lm-eval", "--include_path=/t"]


@pytest.mark.slow
def test_the_wheel_builds_without_warnings(tmp_path):
    from tests.doc_examples import ROOT

    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                            "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stderr
    output = built.stdout + built.stderr
    assert not re.search(r"would be ignored|is absent from the `packages`", output), output[-3000:]


# --- the path itself: fresh clone -> served model answering -> plotted eval --------------------

FIRST_HOUR_PAGE = "getting-started.md"
FIRST_HOUR_STEPS = 5


def _page() -> str:
    from tests.doc_examples import ROOT

    return (ROOT / "docs" / FIRST_HOUR_PAGE).read_text()


def first_hour_blocks():
    """The getting-started page's blocks marked `first-hour`, in page order."""
    from tests.doc_examples import blocks

    return [b for b in blocks(_page()) if "first-hour" in b.marks]


def first_hour_commands() -> list[str]:
    from tests.doc_examples import commands

    return [line for block in first_hour_blocks() for line in commands(block.code)]


def test_the_first_hour_is_at_most_five_documented_commands():
    """Install + decode, serve, (ask), eval: each copied from the page, the README agreeing."""
    import tomllib

    from tests.doc_examples import ROOT

    steps = first_hour_commands()
    assert 3 <= len(steps) <= FIRST_HOUR_STEPS, steps
    install = steps[0]
    assert "pip install" in install and '-e ".[test]"' in install
    assert install.split("&&")[-1].strip().startswith("dllm-decode --prompt")
    serve = [s for s in steps if s.startswith("dllm-decode serve")]
    evaluate = [s for s in steps if s.startswith("dllm-decode eval")]
    assert len(serve) == 1 and len(evaluate) == 1 and " --out " in evaluate[0]
    readme = (ROOT / "README.md").read_text()
    for line in (install, *serve, *evaluate):                    # the README shows the same path
        assert line in readme, line
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = lambda extra: {re.split(r"[<>=\[ ]", r)[0] for r in extras[extra]}  # noqa: E731
    assert names("serve") | names("plot") <= names("test")      # command 1's install serves and plots


def _run(line: str, cwd, timeout: int = 900) -> subprocess.CompletedProcess:
    import shlex

    from tests.doc_examples import venv_env

    return subprocess.run(shlex.split(line), cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=venv_env())


@pytest.mark.slow
def test_the_first_hour_runs_as_documented(tmp_path):
    """Every step of the path, copied from the page, in order, in a scratch folder: the decode
    prints the promised answer and nothing else, the server answers the documented request, the
    eval writes its report and plots and says where. The install itself is this environment (the
    suite runs in an install made by that line); its other half, the decode, runs here."""
    from tests.doc_examples import server

    blocks = first_hour_blocks()
    answered = plotted = False
    for index, block in enumerate(blocks):
        if "serve" in block.marks:
            asks = [c for b in blocks[index + 1:] if "with-server" in b.marks for c in _commands(b)]
            assert asks, "the served model is never asked"
            with server(_commands(block)[0], tmp_path) as port:
                for line in asks:
                    line = re.sub(r"(localhost|127\.0\.0\.1):8000", rf"\g<1>:{port}", line)
                    done = _run(line, tmp_path, timeout=120)
                    assert done.returncode == 0, done.stderr
                    reply = json.loads(done.stdout)
                    assert reply["choices"][0]["text"] == "ella hank mia" and "warning" not in reply
                    answered = True
            continue
        if "with-server" in block.marks:
            continue
        for line in _commands(block):
            if "pip install" in line:
                line = line.split("&&")[-1].strip()
                done = _run(line, tmp_path)
                assert done.returncode == 0, done.stderr
                assert done.stdout.strip() == "ella hank mia" and done.stderr == "", done.stderr
                continue
            done = _run(line, tmp_path)
            assert done.returncode == 0, done.stderr[-2000:]
            assert "Traceback" not in done.stderr and "Warning" not in done.stderr, done.stderr[-2000:]
            if line.startswith("dllm-decode eval"):
                out = tmp_path / line.split(" --out ")[1].split()[0]
                report = (out / "report.md").read_text()
                plots = sorted(p.name for p in out.glob("*.png"))
                assert plots and all(f"]({name})" in report for name in plots)
                assert all(name in done.stdout for name in plots)        # the command says where
                summary = json.loads((out / "summary.json").read_text())
                assert summary["plots"] == [p for p in summary["plots"] if p in plots] and summary["plots"]
                promised = re.search(r"This decodes (\d+) samples", _page()).group(1)
                assert sum(1 for _ in open(out / "samples.jsonl")) == int(promised)   # as the page says
                plotted = True
    assert answered and plotted


def _commands(block) -> list[str]:
    from tests.doc_examples import commands

    return commands(block.code)
