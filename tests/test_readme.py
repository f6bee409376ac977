"""Every example in the README keeps working.

* Every `dllm-decode ...` command line anywhere in the README (code blocks and backticked
  text) parses: its subcommand and options exist (fast; catches renamed options).
* The Python snippet runs and prints what the README says the model answers (fast).
* The README is one screen: at most ~150 lines, no line over 120 characters outside code blocks.
* Every command of the README's bash blocks runs for real (slow); a long-running
  `dllm-decode serve` is started on a free port, probed until ready, sent one request and
  stopped with SIGTERM (`tests/doc_examples.py`), so `pytest -m slow` finishes unattended.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess

import click
import pytest

from tests.doc_examples import (ROOT, blocks, cli_lines as page_cli_lines, commands, one_request, parse,
                                run_shell, server, venv_env)

README = (ROOT / "README.md").read_text()
MAX_LINES = 150
MAX_WIDTH = 120


def fenced(language: str) -> list[str]:
    return [b.code for b in blocks(README) if b.language == language]


def cli_lines() -> list[str]:
    return page_cli_lines(README)


def test_the_readme_has_examples():
    assert len(cli_lines()) >= 3 and fenced("python")


def test_the_readme_is_one_screen():
    lines = README.splitlines()
    assert len(lines) <= MAX_LINES, f"README has {len(lines)} lines; move detail into docs/"
    prose = re.sub(r"```.*?```", "", README, flags=re.S).splitlines()
    wide = [line for line in prose if len(line) > MAX_WIDTH]
    assert not wide, f"{len(wide)} README lines over {MAX_WIDTH} characters, e.g. {wide[0][:80]!r}"


@pytest.mark.parametrize("line", cli_lines())
def test_every_cli_example_parses(line):
    try:
        parse(line)
    except click.exceptions.Exit as done:          # --version / --help answer and exit
        assert done.exit_code == 0, line
    except click.ClickException as err:
        pytest.fail(f"{line!r}: {err.format_message()}")


def test_the_python_snippet_runs(capsys):
    (snippet,) = fenced("python")
    exec(compile(snippet, "README.md", "exec", dont_inherit=True), {})
    printed = capsys.readouterr().out
    assert "ella hank mia" in printed


def test_the_first_command_decodes_what_it_promises():
    first = commands(fenced("bash")[0])[0]
    decode = first.split("&&")[-1].strip()
    assert decode.startswith("dllm-decode")
    result = subprocess.run(shlex.split(decode), capture_output=True, text=True, timeout=300, env=venv_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ella hank mia"


def runnable() -> list[str]:
    """The bash blocks' commands, except the install line and the test command (CI runs both
    itself; the first command's decode is checked above) and commands that talk to a server
    (the serve test sends its own request)."""
    out = []
    for block in blocks(README):
        if block.language != "bash" or block.marks & {"skip", "gpu", "with-server"}:
            continue
        for line in commands(block.code):
            if "pip install" in line or "pytest" in line or line.startswith("curl"):
                continue
            out.append(line)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("line", runnable())
def test_every_bash_example_runs(line, tmp_path):
    if "lm_eval" in line:
        pytest.importorskip("lm_eval")
    if line.startswith("torchrun") and shutil.which("torchrun") is None:
        pytest.skip("torchrun is not on PATH")
    if line.startswith("dllm-decode serve"):
        with server(line, tmp_path) as port:
            assert one_request(port).strip()
        return
    run_shell(line, ROOT if "--include_path" in line else tmp_path)
