"""The benchmark protocol: records become subcommands, `--quick` settings sit under the given ones,
bad settings are usage errors naming their option, and every registered benchmark takes `--quick`."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from dllm_decode.cli import main
from dllm_decode.cli.bench import command
from dllm_decode.eval.bench.benchmarks import BENCHMARKS
from dllm_decode.eval.bench.protocol import (GEN_LENGTHS, THREADS, Benchmark, Option, OptionError, blame,
                                             count, fill, fraction)


def fake(seen: list) -> Benchmark:
    def run(settings, say):
        seen.append(dict(settings))
        say("progress line")
        if settings.get("count") == 13:
            raise OptionError("--count", "13 is unlucky")
        with blame():
            if settings.get("name") == "bad":
                raise ValueError("bad name\nsecond line")
        return {"settings": dict(settings)}

    options = (THREADS, count("--count", "count"), GEN_LENGTHS, fraction("--p", "p"),
               Option(("--name",), "name", str), Option(("--kind",), "kind", ("a", "b")),
               Option(("--flag",), "flag", bool), Option(("--on/--off",), "on", bool))
    return Benchmark("fake", "A fake benchmark.", "Defaults: none.", options, run,
                     lambda report: "TABLE " + ",".join(sorted(report["settings"])),
                     quick=dict(count=2, gen_lengths=(8,), name="q"))


def invoke(*args: str):
    seen: list = []
    result = CliRunner().invoke(command(fake(seen)), list(args))
    return result, seen


def test_given_settings_sit_over_the_quick_ones(tmp_path):
    out = tmp_path / "r.json"
    result, seen = invoke("--quick", "--count", "5", "--json", str(out))
    assert result.exit_code == 0, result.output
    assert seen == [{"count": 5, "gen_lengths": (8,), "name": "q", "threads": 1, "flag": False}]
    assert "TABLE count,flag,gen_lengths,name,threads" in result.output
    assert json.loads(out.read_text())["settings"]["count"] == 5
    result, seen = invoke("--gen-length", "4", "--gen-length", "16", "--kind", "b", "--off", "--p", "1")
    assert seen == [{"threads": 1, "gen_lengths": (4, 16), "kind": "b", "on": False, "flag": False, "p": 1.0}]


@pytest.mark.parametrize("args, fragment", [
    (["--count", "13"], "--count"), (["--name", "bad"], "bad name"), (["--count", "0"], "--count"),
    (["--p", "0"], "--p"), (["--p", "nan"], "not a number"), (["--kind", "c"], "--kind"),
])
def test_bad_settings_are_one_line_usage_errors(args, fragment):
    result, _ = invoke(*args)
    assert result.exit_code == 2 and fragment in result.output and "second line" not in result.output


def test_fill_takes_the_fields_and_blames_bad_values():
    from dllm_decode.eval.bench.spec_tree import TreeOptions

    assert fill(TreeOptions, {"per_task": 2, "model": "ignored"}).per_task == 2
    with pytest.raises(OptionError, match="self_per_task"):
        fill(TreeOptions, {"self_per_task": -1})


def test_every_benchmark_takes_quick_and_json():
    assert len(BENCHMARKS) == 16
    for name, bench in BENCHMARKS.items():
        result = CliRunner().invoke(main, ["bench", name, "--help"])
        assert result.exit_code == 0 and "--quick" in result.output and "--json" in result.output, name
        assert "--quick" in bench.defaults, name                # the help says what --quick runs
        flags = [f for o in bench.options for f in o.flags]
        assert len(flags) == len(set(flags)), name
        command_names = {p.name for p in command(bench).params}
        assert len(command_names) == len(bench.options) + 2, name


def test_click_options_follow_the_declaration():
    params = {p.name: p for p in command(fake([])).params}
    assert isinstance(params["count"].type, click.IntRange) and params["count"].type.min == 1
    assert params["gen_lengths"].multiple and params["flag"].is_flag
    assert params["on"].secondary_opts == ["--off"] and params["on"].default is None
    assert params["threads"].default == 1 and params["p"].type.min_open
