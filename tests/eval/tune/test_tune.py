"""`dllm-decode tune`: splits, budgets, the budgeted search against an exhaustive sweep, presets."""

from __future__ import annotations

import hashlib
import json

import pytest
from click.testing import CliRunner

from dllm_decode.cli import main
from dllm_decode.eval.harness.presets import find_preset
from dllm_decode.eval.tasks import Example
from dllm_decode.eval.tasks.sources import TaskRun
from dllm_decode.eval.tune.output import write
from dllm_decode.eval.tune.search import Budget, split
from dllm_decode.eval.tune.space import SPACE
from dllm_decode.eval.tune.tuner import tune

GRID = [float(v) for v in SPACE["threshold"].grid]          # 1.0 ... 0.5, conservative first


def synthetic(pass_rates: dict[str, dict[float, float]], cost: dict[float, int]):
    """A decoder whose accuracy per (task, threshold) and forwards per threshold are given: prompt
    i passes when its hash quantile is below the rate (so accuracy is monotone in the rate)."""
    def decode(prompts, setting, gen_length, generator):
        options = dict(setting.options)
        t = float(options.get("threshold", 2.0))             # the reference: one token per step
        task = prompts[0].split(":")[0]
        rate = pass_rates[task].get(t, 1.0)
        rows = []
        for p in prompts:
            q = int(hashlib.sha256(p.encode()).hexdigest()[:8], 16) / 16 ** 8
            ok = t == 2.0 or q < rate
            rows.append({"output": "ok" if ok else "no", "nfe": cost.get(t, 64), "tokens_per_step": 1.0,
                         "answer_tokens_per_step": 1.0})
        return rows, 0.01
    return decode


def runs(tasks, n):
    return [TaskRun(t, tuple(Example(t, f"{t}: {i}", "ok") for i in range(n)), lambda e, out: float(out == "ok"))
            for t in tasks]


def test_budget_parsing_and_judgement():
    assert Budget.parse("within:1.0") == Budget("within", 1.0)
    with pytest.raises(ValueError, match="within:POINTS or at-least:PERCENT"):
        Budget.parse("within:x")
    ref, scores = [1.0] * 100, [1.0] * 99 + [0.0]
    assert Budget("within", 1.0).meets(scores, ref) and not Budget("within", 0.5).meets(scores, ref)
    assert Budget("at-least", 99.0).meets(scores, ref)
    assert Budget("within", 1.0).clearly_fails([0.0] * 50 + [1.0] * 50, ref)


def test_splits_are_disjoint_stable_and_sized():
    cal, held = split(runs(["a", "b"], 30), 20, "tune")
    again, _ = split(runs(["a", "b"], 30), 20, "tune")
    for c, h in zip(cal, held):
        assert len(c.examples) == 20 and len(h.examples) == 10
        assert not {e.prompt for e in c.examples} & {e.prompt for e in h.examples}
    assert [e.prompt for e in cal[0].examples] == [e.prompt for e in again[0].examples]
    other, _ = split(runs(["a"], 30), 20, "other salt")
    assert [e.prompt for e in other[0].examples] != [e.prompt for e in cal[0].examples]


def test_search_finds_the_sweeps_best_with_a_quarter_of_its_forwards(tmp_path):
    # task "easy" holds full accuracy down to 0.5; "hard" loses it below 0.9; forwards fall along the grid
    cost = {t: c for t, c in zip(GRID, [64, 48, 32, 24, 16, 8, 4, 2])}
    rates = {"easy": {t: 1.0 for t in GRID}, "hard": {t: (1.0 if t >= 0.9 else 0.5) for t in GRID}}
    outcome = tune(synthetic(rates, cost), "synthetic", runs(["easy", "hard"], 200), rules=["threshold"],
                   caches=["none"], budget=Budget("within", 1.0), calibration=100, salt="tune", gen_length=8,
                   block_length=8, out=tmp_path, exhaustive=True)
    assert dict(outcome.per_task["easy"].setting.options)["threshold"] == "0.5"
    assert dict(outcome.per_task["hard"].setting.options)["threshold"] == "0.9"
    assert dict(outcome.overall.options)["threshold"] == "0.9"
    assert outcome.sweep_best["mean_nfe"] == 32                     # the sweep's best global: 0.9
    assert outcome.search_forwards <= 0.25 * outcome.sweep_forwards
    assert all(f["meets"] for name, per in outcome.held_out.items() for f in per.values() if name != "best_threshold") 
    # the sweep's best threshold is the one checked on the held-out prompts: its section has rows
    assert set(outcome.held_out["best_threshold"]) == {"easy", "hard"}
    write(outcome, tmp_path, model={"name": "synthetic"}, command="test", gen_length=8)
    section = (tmp_path / "report.md").read_text().split("## best_threshold")[1]
    assert "| easy |" in section and "| hard |" in section


def test_the_reference_is_kept_when_nothing_faster_meets_the_budget(tmp_path):
    rates = {"hard": {t: 0.0 for t in GRID}}
    outcome = tune(synthetic(rates, {}), "synthetic", runs(["hard"], 40), rules=["threshold"], caches=["none"],
                   budget=Budget("within", 1.0), calibration=20, salt="tune", gen_length=8, block_length=8,
                   out=tmp_path)
    assert outcome.per_task["hard"] is None and outcome.overall is None
    document = write(outcome, tmp_path, model={"name": "synthetic"}, command="test", gen_length=8)
    assert document["presets"]["hard"]["parts"]["scheduler"]["name"] == "low_confidence"
    assert "nothing faster met the budget" in (tmp_path / "report.md").read_text()


def test_on_the_ideal_model_copy_takes_one_forward_within_budget(tmp_path):
    result = CliRunner().invoke(main, ["tune", "--model", "ideal:noise=0.01", "--tasks", "copy", "--calibration", "4",
                                       "--held-out", "4", "--gen-length", "answer", "--rules", "threshold",
                                       "--budget", "within:20", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "tune: searching 1 rule(s)" in result.output and "tune: checking" in result.output   # never silent
    assert "held out: 100.0%" in result.output and "meets the budget" in result.output
    assert "Command: `dllm-decode " in (tmp_path / "report.md").read_text()     # not the venv's executable path
    presets = json.loads((tmp_path / "presets.json").read_text())
    copy = presets["presets"]["copy"]
    assert copy["parts"]["scheduler"] == {"name": "threshold", "threshold": 0.5}
    assert copy["held_out"]["copy"]["nfe"] == 1.0 and copy["held_out"]["copy"]["meets"]
    preset = find_preset(f"{tmp_path / 'presets.json'}:copy", {"name": "ideal:noise=0.01"})
    assert preset.config(gen_length=8, block_length=8).scheduler.threshold == 0.5


def test_a_preset_tuned_on_another_model_is_refused_in_one_line(tmp_path):
    path = tmp_path / "presets.json"
    path.write_text(json.dumps({"model": {"name": "m", "weights_sha256": "aa"}, "budget": "within:1",
                                "presets": {"copy": {"parts": {"scheduler": {"name": "threshold"}}}}}))
    assert find_preset(f"{path}:copy", {"name": "m", "weights_sha256": "aa"}).parts["scheduler"]["name"] == "threshold"
    with pytest.raises(ValueError, match="tuned on another model") as err:
        find_preset(f"{path}:copy", {"name": "m2", "weights_sha256": "bb"})
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="has no preset 'sort'"):
        find_preset(f"{path}:sort")


@pytest.mark.parametrize("args, message", [
    (["--budget", "half"], "within:POINTS or at-least:PERCENT"),
    (["--rules", "pc_sampler"], "no tuning knob for pc_sampler"),
    (["--caches", "prefix"], "the ideal model has no K/V"),
    (["--confidence", "1.2"], "Invalid value for --confidence"),
    (["--confidence", "nan"], "Invalid value for --confidence"),
    (["--budget", "at-least:150"], "a percentage <= 100"),
    (["--rules", " , "], "no rules given; searchable rules:"),
])
def test_bad_options_get_one_line_errors(tmp_path, args, message):
    result = CliRunner().invoke(main, ["tune", "--model", "ideal", "--tasks", "copy", "--calibration", "2",
                                       "--held-out", "2", "--gen-length", "answer", "--out", str(tmp_path), *args])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_cannot_meet_is_an_exact_bound_on_the_whole_split():
    reference = [1.0] * 99 + [0.0]                       # the reference misses the last prompt
    budget = Budget("within", 1.0)
    assert not budget.cannot_meet([0.0], reference)      # one loss: the last prompt may make it up
    assert not budget.cannot_meet([0.0, 0.0], reference)  # two losses, one gain: exactly 1 point
    assert budget.cannot_meet([0.0, 0.0, 0.0], reference)  # three: at best 2 points over
    assert Budget("at-least", 99.0).cannot_meet([0.0, 0.0], [1.0] * 100)
    assert not Budget("at-least", 98.0).cannot_meet([0.0, 0.0], [1.0] * 100)


def test_the_conservative_acceptance_needs_more_than_a_clean_small_sample():
    budget = Budget.parse("within:5", confidence=0.8)
    clean = [1.0] * 16
    assert Budget("within", 5.0).accepts(clean, clean)            # the point estimate: no loss, accepted
    assert budget.bound(clean, clean) == pytest.approx(budget.least_certifiable(16))
    assert budget.accepts(clean, clean)                           # 0 of 16 lost: bound 4.2 <= 5
    assert not budget.accepts([1.0] * 15 + [0.0], clean)          # one loss of 16: bound above 5
    assert not Budget.parse("within:1", confidence=0.8).accepts(clean, clean)   # 1 point needs n ~ 70
    assert Budget.parse("within:1", confidence=0.8).accepts([1.0] * 100, [1.0] * 100)
    assert Budget.parse("at-least:90", confidence=0.8).accepts([1.0] * 40, [1.0] * 40)
    assert not Budget.parse("at-least:90", confidence=0.8).accepts([1.0] * 37 + [0.0] * 3, [1.0] * 40)  # 92.5% seen
    with pytest.raises(ValueError, match=r"confidence must be in \[0.5, 1\)"):
        Budget.parse("within:1", confidence=1.0)


def test_on_the_ideal_model_the_search_beats_the_sweep_with_a_quarter_of_its_forwards(tmp_path):
    # the analytic ideal model: deterministic copy takes one forward at any threshold, shuffle and
    # replace_random need the conservative end; an exhaustive sweep over the same grid runs beside
    from dllm_decode.cli.options import model_spec
    from dllm_decode.eval.harness.runner import decoder_for
    from dllm_decode.eval.tasks.sources import select_tasks

    spec = model_spec("ideal:noise=0.01")
    decoder, tokenizer = decoder_for(spec)
    runs, _ = select_tasks("copy,shuffle,replace_random", 64, 0)
    outcome = tune(decoder, str(spec), runs, rules=["threshold", "factor", "low_confidence"], caches=["none"],
                   budget=Budget.parse("within:10", confidence=0.9), calibration=32, salt="tune", gen_length=None,
                   block_length=None, out=tmp_path, tokenizer=tokenizer, exhaustive=True)
    assert outcome.search_forwards <= 0.25 * outcome.sweep_forwards
    assert outcome.overall is not None
    overall_cost = sum(p.nfe for p in outcome.points if p.setting == outcome.overall and p.stage == 1.0) / 3
    assert overall_cost <= outcome.sweep_best["mean_nfe"] + 1e-9
    assert outcome.per_task["copy"].nfe == 1.0                    # the oracle's single forward
    for name, per in outcome.held_out.items():
        if name != "best_threshold":
            assert all(f["meets"] for f in per.values()), (name, per)


TUNE_ARGS = ["tune", "--model", "ideal:noise=0.01", "--tasks", "copy,shuffle", "--calibration", "8", "--held-out", "8",
             "--gen-length", "answer", "--rules", "threshold,factor", "--budget", "within:20", "--exhaustive",
             "--no-progress"]


def test_a_rerun_resumes_without_decoding_again(tmp_path):
    args = [a if a != "copy,shuffle" else "copy" for a in TUNE_ARGS if a != "--exhaustive"]
    first = CliRunner().invoke(main, [*args, "--out", str(tmp_path)])
    assert first.exit_code == 0, first.output
    sizes = {p: p.stat().st_size for p in tmp_path.rglob("samples.jsonl")}
    again = CliRunner().invoke(main, [*args, "--out", str(tmp_path)])
    assert again.exit_code == 0, again.output
    assert {p: p.stat().st_size for p in tmp_path.rglob("samples.jsonl")} == sizes      # nothing decoded twice
    assert again.output.splitlines()[-4:] == first.output.splitlines()[-4:]


@pytest.mark.slow
def test_two_gloo_ranks_tune_as_one_process(tmp_path):
    import shutil
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    script = shutil.which("dllm-decode")
    one = CliRunner().invoke(main, [*TUNE_ARGS, "--out", str(tmp_path / "one")])
    assert one.exit_code == 0, one.output
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                          str(port), script, *TUNE_ARGS, "--out", str(tmp_path / "two")],
                         capture_output=True, text=True, timeout=600, env={**__import__("os").environ,
                                                                          "OMP_NUM_THREADS": "1"})
    assert two.returncode == 0, two.stderr[-2000:]
    a, b = (json.loads((tmp_path / d / "tune.json").read_text()) for d in ("one", "two"))
    assert a["points"] == b["points"] and a["held_out"] == b["held_out"]
    assert a["search_forwards"] == b["search_forwards"] and a["sweep_forwards"] == b["sweep_forwards"]


def test_a_preset_that_fails_held_out_says_so_on_screen():
    from dllm_decode.cli.tune import held_out_words

    fail = {"accuracy": 80.0, "delta": -12.5, "delta_ci95": 4.0, "nfe": 3.0, "meets": False}
    assert "FAILS the budget on the held-out prompts" in held_out_words(fail)
    assert "meets the budget" in held_out_words({**fail, "meets": True})
    assert held_out_words(None) == ""


def test_auto_caches_add_early_skipping_where_the_model_takes_it():
    from dllm_decode.cli.tune import _caches
    from dllm_decode.modelspec import ModelSpec
    from dllm_decode.testing import tiny_llada
    from tests.models.conftest import make_dream

    spec = ModelSpec.parse("embedded")
    assert _caches("auto", spec, tiny_llada()) == ["none", "prefix", "dual", "es"]
    assert _caches("auto", spec, make_dream()) == ["none", "prefix", "dual"]
    assert _caches("auto", ModelSpec.parse("ideal"), None) == ["none"]


def test_a_noise_model_tunes_its_own_rule_against_its_defaults(tmp_path):
    """DiffusionGemma (a tiny random one with the tasks' tokenizer): the reference is its own
    rule at 48 steps, the rules that do not run on a noise canvas are skipped with a line, and a
    random model (0% everywhere) meets a within budget at the fewest steps."""
    import torch

    from dllm_decode.eval.harness.runner import diffusion_decoder
    from dllm_decode.eval.tasks.tokenizer import load_tokenizer
    from dllm_decode.models.diffusion_gemma import DiffusionGemmaConfig, DiffusionGemmaModel

    config = DiffusionGemmaConfig.from_dict({"canvas_length": 8, "text_config": {
        "vocab_size": 129, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "global_head_dim": 8,
        "sliding_window": 8, "num_experts": 2, "top_k_experts": 1, "moe_intermediate_size": 8,
        "eos_token_id": 2}})
    torch.manual_seed(0)
    model = DiffusionGemmaModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    model.tokenizer = load_tokenizer()
    decoder = diffusion_decoder(model)
    assert decoder.model.canvas_kind == "noise"
    lines: list[str] = []
    outcome = tune(decoder, "tiny-gemma", runs(["copy"], 8), rules=["threshold", "klass"],
                   caches=["none"], budget=Budget("within", 100.0), calibration=4, salt="tune",
                   gen_length=8, block_length=8, out=tmp_path, log=lines.append)
    assert outcome.reference.scheduler == "uniform_noise" and outcome.reference.options == ()
    assert any("skipped klass: they do not run on a noise canvas" in line for line in lines)
    searched = {p.setting.scheduler for p in outcome.points}
    assert searched <= {"threshold", "uniform_noise"} and "uniform_noise" in searched
    chosen = outcome.per_task["copy"]
    assert chosen is not None and chosen.nfe < outcome.held_out["reference"]["copy"]["nfe"]


def test_the_cli_tunes_the_shipped_noise_model_at_its_own_canvas(tmp_path):
    """`--block-length` defaults to the model's own block or noise canvas (8 for
    `embedded-noise`), so `tune` runs on it without one; the reference is its own rule."""
    from click.testing import CliRunner

    from dllm_decode.cli import main

    result = CliRunner().invoke(main, ["tune", "--model", "embedded-noise", "--tasks", "copy",
                                       "--calibration", "2", "--held-out", "1", "--rules", "threshold",
                                       "--gen-length", "8", "--budget", "within:50", "--confidence", "0.5",
                                       "--out", str(tmp_path), "--no-progress"])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "tune.json").read_text())
    assert {p["setting"]["block_length"] for p in report["points"]} == {8}


def test_a_block_length_knob_keeps_the_lengths_a_block_model_can_decode(tmp_path):
    """DUS sweeps the block length up to 32; on `embedded-bd` (blocks of 8) the search keeps
    1, 2, 4 and 8 instead of failing on 16."""
    from click.testing import CliRunner

    from dllm_decode.cli import main
    from dllm_decode.eval.tune.space import chain

    assert [s.block_length for s in chain("dus", "none", 32, 8, grid=8)] == [1, 2, 4, 8]
    result = CliRunner().invoke(main, ["tune", "--model", "embedded-bd", "--tasks", "sort",
                                       "--calibration", "2", "--held-out", "1", "--rules", "threshold,dus",
                                       "--self-decoders", "none", "--gen-length", "32", "--budget",
                                       "within:50", "--confidence", "0.5", "--out", str(tmp_path),
                                       "--no-progress"])
    assert result.exit_code == 0, result.output
    blocks = {p["setting"]["block_length"] for p in json.loads((tmp_path / "tune.json").read_text())["points"]
              if p["setting"]["scheduler"]["name"] == "dus"}
    assert blocks and blocks <= {1, 2, 4, 8}
