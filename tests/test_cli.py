"""The CLI through click's runner: success, JSON fields, and one-line usage errors (exit 2)."""

import json
import re

import pytest
from click.testing import CliRunner

from dllm_decode.cli import main
from dllm_decode.config import DecodeConfig

TINY = ["--model", "tiny", "--gen-length", "16", "--block-length", "8"]


def run(*args, stdin=None):
    return CliRunner().invoke(main, list(args), input=stdin)


def test_json_output_has_the_documented_fields():
    result = run(*TINY, "--prompt", "w1 w2 w3", "--json", "-o", "threshold=0.8")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert {"text", "nfe", "tokens_per_step", "answer_tokens_per_step", "seconds", "model", "config"} <= out.keys()
    assert DecodeConfig.from_dict(out["config"]).to_dict() == out["config"]
    assert out["config"]["scheduler"] == {"name": "threshold", "threshold": 0.8}
    assert out["model"] == "tiny" and out["nfe"] >= 2
    assert out["tokens_per_step"] == pytest.approx(16 / out["nfe"])


def test_prompt_from_stdin():
    result = run(*TINY, "--scheduler", "low_confidence", "--json", stdin="w4 w5\n")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["nfe"] == 16


def test_list_shows_every_registry_with_defaults():
    result = run("list")
    assert result.exit_code == 0
    assert "schedulers:" in result.output and "caches:" in result.output and "filters:" in result.output
    assert "threshold (float) = 0.9" in result.output


@pytest.mark.parametrize("args, fragment", [
    (["--scheduler", "nope"], "unknown scheduler 'nope'; choose from"),
    (["-o", "threshold=2"], "threshold must be in (0, 1], got 2.0"),
    (["-o", "bogus=1"], "unknown option 'bogus'"),
    (["-o", "threshold=abc"], "expected float"),
    (["-o", "novalue"], "expected KEY=VALUE"),
    (["--gen-length", "10"], "multiple of block_length"),
    (["--gen-length", "0"], "gen_length must be >= 1"),
    (["--prompt", "   "], "the prompt is empty"),
    (["--gen-length", "640", "--block-length", "64"], "exceeds the model's context"),
])
def test_usage_errors_exit_2_with_one_clear_line(args, fragment):
    base = ["--model", "tiny", "--gen-length", "16", "--block-length", "8", "--prompt", "w1"]
    result = run(*base, *args)
    assert result.exit_code == 2, result.output
    assert fragment in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("setup, fragment", [
    (lambda d: None, "does not exist"),
    (lambda d: d.mkdir(), "has no config.json"),
    (lambda d: (d.mkdir(), (d / "config.json").write_text("{oops")), "not valid JSON"),
    (lambda d: (d.mkdir(), (d / "config.json").write_text('{"model_type": "llada"}')), "lacks required key"),
    (lambda d: (d.mkdir(), (d / "config.json").write_text('{"model_type": "gpt9"}')), "gpt9"),
])
def test_bad_model_directories_are_usage_errors(tmp_path, setup, fragment):
    directory = tmp_path / "model"
    setup(directory)
    result = run("--model", str(directory), "--prompt", "hi")
    assert result.exit_code == 2, result.output
    assert fragment in result.output and "Traceback" not in result.output


def test_ideal_model_decodes_a_task_prompt():
    result = run("--model", "ideal", "--gen-length", "8", "--block-length", "8",
                 "--prompt", "sort : mia ella hank", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["text"] == "ella hank mia"


def test_scheduler_fields_inline_as_in_eval_and_o_wins():
    result = run("--model", "tiny", "--gen-length", "8", "--block-length", "8", "--prompt", "w1 w2",
                 "--scheduler", "wino:threshold=0.5,max_accept=0", "-o", "max_accept=3", "--json")
    assert result.exit_code == 0, result.output
    scheduler = json.loads(result.output)["config"]["scheduler"]
    assert (scheduler["name"], scheduler["threshold"], scheduler["max_accept"]) == ("wino", 0.5, 3)
    bad = run("--model", "tiny", "--prompt", "w1", "--scheduler", "wino:bogus=1")
    assert bad.exit_code == 2 and "unknown option 'bogus'" in bad.output


# --- help: torch-free, every list of names computed ------------------------------------------

def _commands(command, path=()):
    """Every (path, command) under the CLI group, the group itself first."""
    import click

    yield path, command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from _commands(sub, (*path, name))


def test_help_of_every_command_imports_no_torch():
    import subprocess
    import sys

    code = ("import sys\nimport click\nfrom dllm_decode.cli import main\n"
            "def walk(c, p=()):\n    yield p\n"
            "    for n, s in getattr(c, 'commands', {}).items():\n        yield from walk(s, (*p, n))\n"
            "for path in list(walk(main)):\n"
            "    try:\n        main([*path, '--help'])\n    except SystemExit as e:\n"
            "        assert e.code == 0, path\n"
            "print('TORCH' if 'torch' in sys.modules else 'NO TORCH')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().endswith("NO TORCH"), done.stdout[-300:]
    assert "threshold" in done.stdout and "heuristic" in done.stdout      # the lists were printed


def test_registry_names_read_without_import_equal_the_registries():
    from dllm_decode.registry import HOMES, names, registry

    for kind in HOMES:
        assert names(kind) == tuple(registry(kind)), kind


# An option whose value is a registry name lists every registered name in its help.
NAMED_OPTIONS = {"--scheduler": "scheduler", "--cache": "cache", "--filter": "filter",
                 "--dllm-scheduler": "scheduler", "--draft": "drafter", "--variant": "cache"}
CAUSAL_MODEL_OPTIONS = {("bench", "spec"): "--draft", ("bench", "tree"): "--draft"}   # model names
FIXED_CHOICES = {("bench", "shaped"): "--cache"}       # a click.Choice of the caches it times
AR_RULES = {("spec",): {"--scheduler": ("draft_length", "scheduler")}}


def test_every_help_list_of_names_is_the_whole_registry():
    from dllm_decode.registry import registry

    checked = 0
    for path, command in _commands(main):
        for param in command.params:
            flag = next((f for f in param.opts if f in NAMED_OPTIONS), None)
            if flag is None or flag in (CAUSAL_MODEL_OPTIONS.get(path), FIXED_CHOICES.get(path)):
                continue
            kinds = AR_RULES.get(path, {}).get(flag, (NAMED_OPTIONS[flag],))
            missing = [name for kind in kinds for name in registry(kind)
                       if not re.search(rf"\b{name}\b", param.help or "")]
            assert not missing, f"{' '.join(('dllm-decode',) + path)} {flag} help lacks {missing}"
            checked += 1
    assert checked >= 13


def test_bench_cache_help_names_what_it_compares():
    from dllm_decode.eval.bench.cache import CACHE_NAMES, NEW_CACHES

    help_text = main.commands["bench"].commands["cache"].help
    for label in (*CACHE_NAMES, *NEW_CACHES):
        name = label.partition(":")[0] if ":" not in label else label.split("=")[-1]
        assert name in help_text, label
    result = run("bench", "cache", "--help")
    assert result.exit_code == 0 and "--new-caches" in result.output


def test_draft_spellings_cover_every_drafter_and_tree_drafters_are_declared():
    from dllm_decode.speculative.drafters import DRAFTERS, draft_help, tree_drafters
    from dllm_decode.speculative.drafters.spelling import SPELLINGS

    assert set(SPELLINGS) == set(DRAFTERS)
    assert all(SPELLINGS[name] in draft_help() for name in DRAFTERS)
    assert set(tree_drafters()) == {"lookup", "layerskip", "model", "staged"}
    result = run("spec", "--draft", "none", "--tree-branch", "2", "--prompt", "x")
    assert result.exit_code == 2 and "drafts that can: lookup, layerskip, model, staged" in result.output


def test_bench_json_reports_are_written_atomically(tmp_path, monkeypatch):
    """A benchmark's `--json` file is whole or untouched: a failed write (a full disk) keeps the
    previous report, is one line and exit 1, and leaves no temporary file."""
    import errno
    from pathlib import Path

    from dllm_decode.cli.bench import command
    from dllm_decode.eval.bench.protocol import Benchmark

    bench = Benchmark("fake", "A stand-in.", "", (), lambda settings, say: {"rows": [1, 2]},
                      lambda report: "done")
    target = tmp_path / "report.json"
    result = CliRunner().invoke(command(bench), ["--json", str(target)])
    assert result.exit_code == 0, result.output
    assert json.loads(target.read_text()) == {"rows": [1, 2]}
    original = Path.write_bytes

    def full(self, data):
        original(self, data[:3])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", full)
    from dllm_decode.cli import main as group

    group.add_command(command(bench))
    try:
        result = CliRunner().invoke(group, ["fake", "--json", str(target)])
    finally:
        group.commands.pop("fake")
    assert result.exit_code == 1 and "no space left on device" in result.output, result.output
    assert json.loads(target.read_text()) == {"rows": [1, 2]}
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_click_choices_equal_the_library_constants_they_mirror():
    """A `click.Choice` must stay torch-free, so it cannot import the constant it lists from a
    module that imports torch; each such copy is checked against its source here."""
    from dllm_decode.eval.tasks.released import SCORING
    from dllm_decode.eval.training.filter import TRAJECTORIES
    from dllm_decode.models.compact import DLLM_RUNTIMES
    from dllm_decode.modelspec import RUNTIMES as SPEC_RUNTIMES
    from dllm_decode.speculative.compact import RUNTIMES

    def choices(path, flag):
        command = main
        for name in path:
            command = command.commands[name]
        (param,) = [p for p in command.params if flag in p.opts]
        return tuple(param.type.choices)

    assert choices((), "--runtime") == DLLM_RUNTIMES
    assert choices(("serve",), "--runtime") == DLLM_RUNTIMES
    assert choices(("spec",), "--runtime") == RUNTIMES == SPEC_RUNTIMES
    assert choices(("spec",), "--draft-runtime") == (*RUNTIMES, "auto")
    assert choices(("train-filter",), "--trajectory") == TRAJECTORIES
    assert choices(("eval",), "--released-scoring") == SCORING
