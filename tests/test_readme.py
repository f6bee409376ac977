"""Every example in the README keeps working.

* Every `dllm-decode ...` command line anywhere in the README (code blocks and the figures table)
  parses: its subcommand and options exist (fast; catches renamed options).
* The Python snippet runs and prints what the README says the model answers (fast).
* Every command of the README's bash blocks runs for real (slow: the benchmark and eval examples
  take minutes on a 2-core CPU).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import pathlib
import warnings

import click
import pytest

from dllm_decode.cli import main

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
RUNNERS = ("dllm-decode", "python -m", "torchrun", "HF_DATASETS_OFFLINE")


def fenced(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def commands(block: str) -> list[str]:
    """Shell commands of a code block: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    out = []
    for line in joined.splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        if line.startswith(RUNNERS) or " && dllm-decode" in line:
            out.append(line)
    return out


def cli_lines() -> list[str]:
    """Every `dllm-decode ...` invocation in the README: code blocks and backticked table cells."""
    lines = [c for block in fenced("bash") for c in commands(block)]
    lines += [m.replace("\n", " ") for m in re.findall(r"`(dllm-decode [^`]+)`", README)]
    found = []
    for line in lines:
        for part in re.split(r"&&|;", line):
            part = part.strip()
            if part.startswith("dllm-decode"):
                found.append(part)
    return sorted(set(found))


def parse(command_line: str) -> None:
    """Let click parse the line as `dllm-decode` would (options resolved, nothing run)."""
    args = shlex.split(command_line)[1:]
    args = [a for a in args if "|" not in a]         # `hf|compact`-style alternatives in prose
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx = main.make_context("dllm-decode", list(args))
        rest = [*ctx.protected_args, *ctx.args]
    while rest:
        command = ctx.command.get_command(ctx, rest[0]) if isinstance(ctx.command, click.Group) else None
        assert command is not None, f"unknown subcommand {rest[0]!r} in {command_line!r}"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            ctx = command.make_context(rest[0], rest[1:], parent=ctx)
            rest = [*getattr(ctx, "protected_args", []), *ctx.args] if isinstance(command, click.Group) else []


def test_the_readme_has_examples():
    assert len(cli_lines()) >= 8 and fenced("python")


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
    exec(compile(snippet, "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "ella hank mia" in printed


def test_the_first_command_decodes_what_it_promises():
    first = commands(fenced("bash")[0])[0]
    decode = first.split("&&")[-1].strip()
    assert decode.startswith("dllm-decode")
    result = subprocess.run(shlex.split(decode), capture_output=True, text=True, timeout=300, env=venv_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ella hank mia"


def venv_env() -> dict[str, str]:
    """The environment with this interpreter's scripts first on PATH, so the README's commands
    resolve to the installed package even when pytest runs without the venv activated."""
    scripts = str(pathlib.Path(sys.executable).parent)
    return {**os.environ, "PATH": scripts + os.pathsep + os.environ.get("PATH", "")}


def runnable() -> list[str]:
    """The bash blocks' commands, except the install line and the test command (CI runs both
    itself; the first command's decode is checked above)."""
    out = []
    for block in fenced("bash"):
        for line in commands(block):
            if "pip install" in line or "pytest" in line:
                continue
            out.append(line)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("line", runnable())
def test_every_bash_example_runs(line, tmp_path):
    if "lm_eval" in line and shutil.which("lm_eval") is None and "lm_eval_adapter" not in line:
        pytest.skip("lm_eval is not installed")
    if "lm_eval_adapter" in line:
        pytest.importorskip("lm_eval")
    if line.startswith("torchrun") and shutil.which("torchrun") is None:
        pytest.skip("torchrun is not on PATH")
    if line.startswith("python "):
        line = line.replace("python ", f"{shlex.quote(sys.executable)} ", 1)
    cwd = ROOT if "--include_path" in line else tmp_path
    result = subprocess.run(line, shell=True, cwd=cwd, capture_output=True, text=True,
                            timeout=3600, env={**venv_env(), "PYTHONUNBUFFERED": "1"})
    assert result.returncode == 0, f"{line}\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
