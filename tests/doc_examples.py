"""Reading and running the code blocks of the README and the docs pages (shared by
`test_readme.py` and `test_docs.py`).

A block may be preceded by a marker comment that says how the tests treat it:

    <!-- test: gpu -->               run only where CUDA is available (parsed everywhere)
    <!-- test: skip (why) -->        never run (its `dllm-decode` lines are still parsed)
    <!-- test: serve -->             a long-running `dllm-decode serve`: started on a free port,
                                     probed until ready, kept up for the page's later
                                     `with-server` blocks, then stopped with SIGTERM (exit 0)
    <!-- test: with-server -->       run while that server is up, port 8000 replaced by its port
    <!-- test: needs lm_eval -->     skipped when lm-evaluation-harness is not installed
    <!-- test: first-hour -->        also a step of the new user's path from a fresh clone to a
                                     served model and a plotted eval (`tests/test_first_hour.py`)

Words combine (`with-server needs lm_eval`). Unmarked python blocks run in one namespace per
page, in order; unmarked bash blocks run command by command in a scratch directory.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parent.parent
RUNNERS = ("dllm-decode", "dllm-lm-eval", "lm_eval", "python -m", "torchrun", "HF_DATASETS_OFFLINE", "curl")
FENCE = re.compile(r"(?:<!--\s*test:\s*(?P<marks>[^>]*?)\s*-->\s*\n)?```(?P<lang>[\w-]*)[^\n]*\n(?P<code>.*?)```",
                   re.S)
SERVE_READY_S = 180


@dataclass
class Block:
    language: str
    code: str
    marks: set[str] = field(default_factory=set)

    @property
    def runnable_here(self) -> str | None:
        """Why this block cannot run on this machine, or None."""
        if "skip" in self.marks:
            return "marked skip"
        if "gpu" in self.marks and not cuda_available():
            return "needs a GPU"
        if "lm_eval" in self.marks and importlib.util.find_spec("lm_eval") is None:
            return "lm_eval is not installed"
        return None


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def blocks(text: str) -> list[Block]:
    out = []
    for match in FENCE.finditer(text):
        marks = set(re.split(r"[\s,()]+", match.group("marks") or "")) - {""}
        out.append(Block(match.group("lang"), match.group("code"), marks))
    return out


def commands(code: str) -> list[str]:
    """Shell commands of a code block: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", code)
    out = []
    for line in joined.splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        if line.startswith(RUNNERS) or " && dllm-decode" in line:
            out.append(line)
    return out


def cli_lines(text: str) -> list[str]:
    """Every `dllm-decode ...` invocation in a page: code blocks of any language and backticked
    inline code."""
    lines = [c for block in blocks(text) for c in commands(block.code)]
    lines += [m.replace("\n", " ") for m in re.findall(r"`(dllm-decode [^`]+)`", text)
              if " -" in m]                              # a bare `dllm-decode eval` names a command
    found = []
    for line in lines:
        for part in re.split(r"&&|;", line):
            part = part.strip()
            if part.startswith("dllm-decode"):
                found.append(part)
    return sorted(set(found))


def parse(command_line: str) -> None:
    """Let click parse the line as `dllm-decode` would (options resolved, nothing run)."""
    from dllm_decode.cli import main

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


def venv_env() -> dict[str, str]:
    """The environment with this interpreter's scripts first on PATH, so documented commands
    resolve to the installed package even when pytest runs without the venv activated."""
    scripts = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": scripts + os.pathsep + os.environ.get("PATH", ""),
            "PYTHONUNBUFFERED": "1"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def with_port(line: str, port: int) -> str:
    """A `serve` line on `port` (its own `--port` replaced, or one added)."""
    if re.search(r"--port[ =]\d+", line):
        return re.sub(r"--port[ =]\d+", f"--port {port}", line)
    return f"{line} --port {port}"


@contextlib.contextmanager
def server(line: str, cwd: Path) -> Iterator[int]:
    """Start a documented `dllm-decode serve` line on a free port, wait until `/health` answers,
    yield the port; stop it with SIGTERM and check it exits 0 (the documented shutdown)."""
    port = free_port()
    process = subprocess.Popen(shlex.split(with_port(line, port)), cwd=cwd, env=venv_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + SERVE_READY_S
        while True:
            if process.poll() is not None:
                raise AssertionError(f"{line!r} exited with {process.returncode}:\n{process.stdout.read()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{line!r} did not answer /health within {SERVE_READY_S} s")
            time.sleep(0.5)
        yield port
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                raise AssertionError(f"{line!r} did not stop within 60 s of SIGTERM") from None
    assert process.returncode == 0, f"{line!r} exited with {process.returncode} after SIGTERM"


def one_request(port: int) -> str:
    """POST one completion to a live server; returns the answer text."""
    import json

    body = json.dumps({"model": "embedded", "prompt": "sort : mia ella hank", "max_tokens": 32}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        return json.loads(reply.read())["choices"][0]["text"]


def run_shell(line: str, cwd: Path, port: int | None = None, timeout: int = 3600) -> None:
    if port is not None:
        line = re.sub(r"(localhost|127\.0\.0\.1):8000", rf"\g<1>:{port}", line)
    if line.startswith("python "):
        line = line.replace("python ", f"{shlex.quote(sys.executable)} ", 1)
    if line.startswith("curl "):
        line = line.replace("curl ", "curl --fail-with-body ", 1)
    result = subprocess.run(line, shell=True, cwd=cwd, capture_output=True, text=True,
                            timeout=timeout, env=venv_env())
    assert result.returncode == 0, f"{line}\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"


def run_python(code: str, namespace: dict, name: str, port: int | None = None) -> None:
    if port is not None:
        code = re.sub(r"(localhost|127\.0\.0\.1):8000", rf"\g<1>:{port}", code)
    import types

    module = sys.modules.setdefault("doc_example", types.ModuleType("doc_example"))
    namespace.setdefault("__name__", "doc_example")
    module.__dict__.update(namespace)
    exec(compile(code, name, "exec", dont_inherit=True), module.__dict__)
    namespace.update(module.__dict__)


def run_page(text: str, name: str, cwd: Path, *, fast_only: bool = False) -> list[str]:
    """Run a page's blocks in order (see the module docstring); returns what was skipped.
    `fast_only`: only the python blocks that need no server (the bash blocks, servers and
    `with-server` blocks are the slow tier)."""
    skipped: list[str] = []
    namespace: dict = {"__name__": "doc_example"}
    sys.modules.pop("doc_example", None)                # a fresh module per page
    with contextlib.ExitStack() as stack:
        port = None
        for block in blocks(text):
            if block.language not in ("bash", "python"):
                continue
            if fast_only and (block.language != "python" or block.marks & {"serve", "with-server"}):
                continue
            why = block.runnable_here
            if why:
                skipped.append(f"{block.code.strip()[:60]}: {why}")
                continue
            if "serve" in block.marks:
                stack.close()
                (line,) = [c for c in commands(block.code) if c.startswith("dllm-decode serve")]
                port = stack.enter_context(server(line, cwd))
                continue
            if "with-server" in block.marks and port is None:
                raise AssertionError(f"{name}: a with-server block without a serve block before it")
            live = port if "with-server" in block.marks else None
            if block.language == "python":
                run_python(block.code, namespace, name, live)
                continue
            for line in commands(block.code):
                if "pip install" in line or "pytest" in line:
                    continue
                if line.startswith("dllm-decode serve"):
                    with server(line, cwd) as serving:     # an unmarked serve line: one request
                        assert one_request(serving).strip()
                    continue
                if (re.search(r"(^|\s)(dllm-lm-eval|lm_eval)\s|lm_eval_adapter", line)
                        and importlib.util.find_spec("lm_eval") is None):
                    skipped.append(f"{line[:60]}: lm_eval is not installed")
                    continue
                if line.startswith("curl") and live is None:
                    skipped.append(f"{line[:60]}: talks to a server (mark the block with-server)")
                    continue
                if line.startswith("torchrun") and shutil.which("torchrun") is None:
                    skipped.append(f"{line[:60]}: torchrun is not on PATH")
                    continue
                run_shell(line, ROOT if "--include_path" in line else cwd, live)
    return skipped
