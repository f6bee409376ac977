"""`dllm-decode bench`: the one interleaved timer (order, medians, ratios on a fake clock), the
figures read from the right runs (NFE, answer tokens, speedups on models whose every step is
known, under a clock that ticks once per forward), the length fit, and each subcommand's quick
configuration end to end on the tiny model."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

from dllm_decode.cli import main
from dllm_decode.config import DecodeConfig
from dllm_decode.eval.bench.measure import Combo, Sample, chunked, run_grid
from dllm_decode.eval.bench.oracle_gap import token_waits
from dllm_decode.eval.bench.scaling import default_lengths, fit_exponent, fits
from dllm_decode.eval.bench.sections import relative, row
from dllm_decode.eval.bench.subject import Subject, samples_for
from dllm_decode.eval.bench.timing import forward_timer, interleave, rotation, speedup
from dllm_decode.sampler import generate
from dllm_decode.schedulers import MASK_SCHEDULERS, SCHEDULERS, LowConfidenceScheduler, ThresholdScheduler
from dllm_decode.testing import OracleMaskPredictor, tiny_llada, tiny_llada_with_tokenizer


class FakeClock:
    """Seconds that move only when a test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def ticking(model, clock: FakeClock):
    """`model` whose every forward advances `clock` by one second: a decode's seconds are the
    forwards it ran (batch rows decode in lockstep, so a chunk costs its slowest row's NFE)."""
    inner = model.forward

    def forward(*args, **kwargs):
        clock.now += 1.0
        return inner(*args, **kwargs)

    model.forward = forward
    return model


# --- the interleaved timer -------------------------------------------------------------------

def test_interleave_rotates_the_order_per_repeat_and_item():
    calls = []
    runs = interleave([("a", [0, 1]), ("b", [0, 1]), ("c", [0])], repeats=2,
                      job=lambda label, index, item: lambda: calls.append((label, index)))
    assert calls == [("a", 0), ("b", 0), ("c", 0), ("b", 1), ("a", 1),     # repeat 0
                     ("b", 0), ("c", 0), ("a", 0), ("a", 1), ("b", 1)]     # repeat 1, rotated
    assert [len(r) for r in runs["a"].runs] == [2, 2] and [len(r) for r in runs["c"].runs] == [1, 1]
    assert rotation(3, 1, 1) == [2, 0, 1]


def test_interleave_medians_and_ratios_on_a_fake_clock():
    """Per-repeat sums, their median (not the mean, not the last repeat), and the ratio of
    medians; the untimed preparation of a job never counts."""
    clock = FakeClock()
    cost = {"a": [[1, 2], [4, 6], [3, 1]], "b": [[2], [1], [8]]}      # [repeat][item]
    seen = {"a": 0, "b": 0}

    def job(label, index, item):
        clock.now += 100.0                                            # preparation: untimed
        repeat = seen[label] // len(cost[label][0])
        seen[label] += 1

        def call():
            clock.now += cost[label][repeat][index]
            return (label, repeat, index)
        return call

    runs = interleave([("a", ["x", "y"]), ("b", ["x"])], 3, job, clock)
    assert runs["a"].per_repeat() == [3, 10, 4] and runs["b"].per_repeat() == [2, 1, 8]
    assert runs["a"].seconds() == 4 and runs["b"].seconds() == 2
    assert speedup(runs["a"], runs["b"]) == 2.0 and speedup(runs["b"], runs["a"]) == 0.5
    assert runs["a"].values(1) == [("a", 1, 0), ("a", 1, 1)]


def test_interleave_refuses_duplicate_labels_and_no_repeats():
    with pytest.raises(ValueError, match="unique labels"):
        interleave([("a", [1]), ("a", [2])], 1, lambda *args: lambda: None)
    with pytest.raises(ValueError, match="repeats"):
        interleave([("a", [1])], 0, lambda *args: lambda: None)


def test_forward_timer_counts_and_restores():
    model = tiny_llada(layers=1)
    config = DecodeConfig(scheduler=LowConfidenceScheduler(), gen_length=8, block_length=4)
    with forward_timer(model) as spent:
        result = generate(model, [[1, 2, 3]], config)
    assert spent[1] == int(result.nfe[0]) == 8 and spent[0] > 0
    assert "forward" not in vars(model)
    with forward_timer(None) as nothing:
        pass
    assert nothing == [0.0, 0]


# --- figures from the right runs -------------------------------------------------------------

EOS, MASK = 2, 12
TARGET = torch.tensor([5, 6, 7, EOS, 8, 9, 10, 11])
CONFIDENCE = torch.tensor([0.95, 0.5, 0.97, 0.99, 0.6, 0.7, 0.8, 0.9])


def test_grid_rows_on_an_oracle_model():
    """gen 8, block 4, the end of text at position 3, so every decode stops after block 1 with a
    3-token answer. One token per step: 4 forwards; threshold 0.9: positions 0, 2, 3, then the
    forced 1: 2 forwards; the oracle following one token per step: all four at once, 1 forward
    (its reference decode is preparation, untimed). With one second per forward and two prompts
    decoding in lockstep, every figure is known."""
    clock = FakeClock()
    model = ticking(OracleMaskPredictor(TARGET, CONFIDENCE, vocab_size=13, mask_token_id=MASK,
                                        eos_token_id=EOS), clock)
    base = DecodeConfig(scheduler=LowConfidenceScheduler(), gen_length=8, block_length=4)
    combos = [Combo("oracle", base, oracle=True, reference="low_confidence"),   # first: needs a reference
              Combo("low_confidence", base),
              Combo("threshold", DecodeConfig(scheduler=ThresholdScheduler(0.9), gen_length=8, block_length=4))]
    samples = [Sample("t", [1, 3]), Sample("t", [4, 5])]
    chunks = chunked(samples, 2)
    measured = run_grid(model, [(c, chunks) for c in combos], repeats=3, clock=clock)
    subject = Subject(model, "oracle", None, None)
    rows = {r["label"]: r for r in (row(subject, samples, m) for m in measured.values())}
    relative(list(rows.values()), "low_confidence", "baseline")
    relative(list(rows.values()), "oracle", "oracle")
    for label, forwards in (("low_confidence", 4), ("threshold", 2), ("oracle", 1)):
        r = rows[label]
        assert measured[label].runs.per_repeat() == [forwards] * 3
        assert measured[label].answer_tokens() == [3, 3]
        assert r["nfe"] == forwards and r["tokens_per_step"] == 8 / forwards
        assert r["answer_tokens_per_step"] == 3 / forwards
        assert r["seconds"] == forwards and r["seconds_per_sample"] == forwards / 2
        assert r["answer_tokens_per_second"] == 6 / forwards
        assert r["speedup_vs_baseline"] == 4 / forwards and r["nfe_vs_oracle"] == forwards
        assert r["accuracy"] is None
    assert measured["oracle"].tokens() == measured["low_confidence"].tokens() == [[5, 6, 7] + [EOS] * 5] * 2


def test_oracle_without_its_reference_is_refused():
    model = tiny_llada(layers=1)
    config = DecodeConfig(scheduler=LowConfidenceScheduler(), gen_length=4, block_length=4)
    with pytest.raises(ValueError, match="needs a reference"):
        run_grid(model, [(Combo("oracle", config, oracle=True), [[Sample("t", [1, 2])]])], 1)


def test_cache_rows_read_the_right_medians():
    """One second per forward: at batch 1 a cell's seconds per sample is its mean NFE; at batch 3
    the forwards of the three chunks' batched decodes; every speedup is none's seconds over the
    cache's; answer tokens per second are the answer lengths over those seconds."""
    from dllm_decode.eval.bench.cache import CacheOptions, run_cache

    clock = FakeClock()
    model = ticking(tiny_llada_with_tokenizer(), clock)
    options = CacheOptions(gen_lengths=(16,), batch_sizes=(1, 3), per_task=1, repeats=1, forward_repeats=1,
                           block_length=8, new_caches=False)   # the layer-wise caches skip the ticking forward
    report = run_cache(Subject(model, "tiny", model.tokenizer, None), options, clock=clock)
    rows = {(r["batch"], r["cache"]): r for r in report["rows"]}
    assert len(rows) == 6 and report["prompts"] == 7
    for cache in ("none", "prefix", "dual"):
        one = rows[1, cache]
        assert one["seconds_per_sample"] == pytest.approx(one["nfe"])
        assert one["answer_tokens_per_second"] == pytest.approx(one["answer_tokens"] / one["nfe"])
        assert one["tokens_per_second"] == pytest.approx(16 / one["nfe"])
        assert one["speedup"] == pytest.approx(rows[1, "none"]["nfe"] / one["nfe"])
        assert rows[3, cache]["speedup"] == pytest.approx(rows[3, "none"]["seconds_per_sample"]
                                                          / rows[3, cache]["seconds_per_sample"])
        assert one["vs_dual"] == pytest.approx(rows[1, "dual"]["nfe"] / one["nfe"])
    assert rows[1, "none"]["same_tokens_as_none"] == 100.0 and rows[1, "none"]["speedup"] == 1.0
    config = DecodeConfig(scheduler=ThresholdScheduler(0.9), gen_length=16, block_length=8)
    samples = samples_for(Subject(model, "tiny", model.tokenizer, None), 1, tasks=None)
    nfe = [int(generate(model, [s.prompt], config).nfe[0]) for s in samples]
    assert rows[1, "none"]["nfe"] == pytest.approx(sum(nfe) / 7)
    forwards = 0
    for chunk in chunked(samples, 3):
        with forward_timer(model) as spent:
            generate(model, [s.prompt for s in chunk], config)
        forwards += spent[1]
    assert rows[3, "none"]["seconds_per_sample"] == pytest.approx(forwards / 7)


# --- length scaling --------------------------------------------------------------------------

def test_fit_exponent_recovers_a_power_law():
    lengths = [64, 128, 256, 512, 992]
    assert fit_exponent(lengths, [3.0 * g ** 0.5 for g in lengths]) == pytest.approx(0.5)
    assert fit_exponent([1, 2], [5.0, 5.0]) == 0.0
    bent = [g if g < 256 else g ** 1.5 / 16 for g in lengths]
    assert set(fits(lengths, bent)) == {"64-992", "256-992"}
    assert fits(lengths, bent)["256-992"] == pytest.approx(1.5)
    with pytest.raises(ValueError, match="two or more distinct"):
        fit_exponent([64, 64], [1.0, 2.0])


def test_default_lengths_double_up_to_the_context():
    assert default_lengths(1024 - 18, 32) == [64, 128, 256, 512, 992]
    assert default_lengths(512, 32) == [64, 128, 256, 512]
    assert default_lengths(40, 16) == [32]
    with pytest.raises(ValueError, match="no canvas"):
        default_lengths(10, 32)


def test_scaling_seconds_per_sample_are_the_forwards():
    from dllm_decode.eval.bench.scaling import ScalingOptions, run_scaling

    clock = FakeClock()
    model = ticking(tiny_llada_with_tokenizer(), clock)
    options = ScalingOptions(gen_lengths=(8, 16, 32), block_length=8, batch=1, per_task=1, repeats=1)
    report = run_scaling(Subject(model, "tiny", model.tokenizer, None), options, clock=clock)
    for r in report["rows"]:
        assert r["seconds_per_sample"] == pytest.approx(r["nfe"])
    for name, fit in report["exponents"].items():
        mine = [r["seconds_per_sample"] for r in report["rows"] if r["config"] == name]
        assert fit == {"8-32": pytest.approx(fit_exponent([8, 16, 32], mine))}
    with pytest.raises(ValueError, match="context"):
        run_scaling(Subject(model, "tiny", model.tokenizer, None),
                    ScalingOptions(gen_lengths=(512,), block_length=8, repeats=1), clock=clock)


def test_scaling_cache_rows_decode_under_their_cache():
    from dllm_decode.caches import DualCache
    from dllm_decode.eval.bench.scaling import ScalingOptions

    cache = DualCache(block_refresh=False)
    configs = ScalingOptions(caches=(("dual:block_refresh=false", cache),)).configs(64)
    assert list(configs) == ["default", "one token per step", "default, cache dual:block_refresh=false"]
    cached = configs["default, cache dual:block_refresh=false"]
    assert cached.cache is cache and cached.scheduler == configs["default"].scheduler
    assert cached.gen_length == 64


# --- oracle gap ------------------------------------------------------------------------------

def test_token_waits_on_a_known_model():
    """Every candidate is the target from the start, so one token per step commits positions in
    confidence order and each waits exactly its commit step; no candidate is ever wrong."""
    target = torch.tensor([4, 6, 5, 1, 7, 3])              # no end-of-text: all answer tokens
    confidence = torch.tensor([0.5, 0.9, 0.6, 0.8, 0.7, 0.95])
    model = OracleMaskPredictor(target, confidence, vocab_size=9, mask_token_id=8, eos_token_id=2)
    config = DecodeConfig(scheduler=LowConfidenceScheduler(), gen_length=6, block_length=6)
    result = generate(model, [[1, 2]], config, trace=True)
    assert torch.equal(result.tokens[0], target)
    waits = token_waits(result, model.eos_token_ids)
    order = confidence.argsort(descending=True).tolist()    # commit order
    assert waits["wait"] == [order.index(p) for p in range(6)]
    assert waits["start_confidence"] == pytest.approx(confidence.tolist())
    assert waits["wrong_confidence"] == []


# --- the AR section --------------------------------------------------------------------------

def test_ar_section_with_tiny_causal_models(monkeypatch):
    """Greedy speculative decoding returns exactly the plain AR output; plain AR runs one target
    forward per token; the speedup is the ratio of the two medians."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import dllm_decode.models.causal as causal
    from dllm_decode.eval.bench.benchmarks import BENCHMARKS
    from dllm_decode.eval.bench.sections import SuiteOptions
    from dllm_decode.eval.bench.spec import section_ar
    from dllm_decode.eval.bench.subject import load_subject
    from dllm_decode.testing import tiny_tokenizer

    def tiny_causal(seed: int) -> LlamaForCausalLM:
        torch.manual_seed(seed)
        config = LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                             intermediate_size=48, vocab_size=37, max_position_embeddings=128,
                             pad_token_id=35, bos_token_id=35, eos_token_id=35)
        model = LlamaForCausalLM(config).eval()
        model.tokenizer = tiny_tokenizer(37)
        return model

    models = {"ar_target": tiny_causal(0), "ar_draft": tiny_causal(1)}
    monkeypatch.setattr(causal, "load_causal_lm", lambda name, **kwargs: models[name])
    subject = load_subject("tiny")
    quick = SuiteOptions(**BENCHMARKS["ar"].quick)
    report = section_ar(subject, samples_for(subject, 1), quick)
    plain, spec = report["rows"]
    assert report["samples"] == quick.ar_samples and spec["same_output"] == 100 and spec["exact"]
    assert plain["target_forwards_per_token"] == 1.0 and plain["speedup"] == 1.0
    assert spec["speedup"] == pytest.approx(plain["seconds"] / spec["seconds"])


# --- the command line ------------------------------------------------------------------------

SUBCOMMANDS = ("all", "schedulers", "stack", "loop", "gap", "ar", "compile", "runtime", "cache", "scaling",
               "spec", "bd", "serving", "tree", "shaped")


def test_bench_help_imports_no_torch():
    code = ("import sys\nfrom dllm_decode.cli import main\n"
            f"for sub in ([],) + tuple([s] for s in {SUBCOMMANDS!r}):\n"
            "    try:\n        main(['bench', *sub, '--help'])\n    except SystemExit as e:\n"
            "        assert e.code == 0, sub\n"
            "print('TORCH' if 'torch' in sys.modules else 'NO TORCH')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("NO TORCH")
    for sub in SUBCOMMANDS:
        assert f"  {sub} " in out


def _bench(*args: str):
    return CliRunner().invoke(main, ["bench", *args])


def test_quick_schedulers_on_tiny(tmp_path):
    out = tmp_path / "bench.json"
    result = _bench("schedulers", "--quick", "--model", "tiny", "--json", str(out))
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert "TINY" in report["model"] and report["machine"]["torch"] == torch.__version__
    assert set(report) >= {"schedulers", "options", "samples"} and "stack" not in report
    rows = {r["label"]: r for r in report["schedulers"]["rows"]}
    assert set(MASK_SCHEDULERS) <= set(rows) and {"preset:eb_eotp", "oracle"} <= set(rows)
    assert rows["oracle"]["nfe"] <= rows["low_confidence"]["nfe"]
    for r in rows.values():
        assert r["speedup_vs_baseline"] == pytest.approx(rows["low_confidence"]["seconds"] / r["seconds"])
        assert r["nfe_vs_oracle"] == pytest.approx(r["nfe"] / rows["oracle"]["nfe"])
    assert "targets" not in report and "MISSED" not in result.output and "[met]" not in result.output


def test_quick_stack_and_loop_on_a_given_row(tmp_path):
    out = tmp_path / "stack.json"
    result = _bench("stack", "--quick", "--model", "tiny", "--best", "preset:eb_eotp", "--json", str(out))
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert "schedulers" not in report                      # --best skips the scheduler table
    by = {r["label"]: r for r in report["stack"]["rows"]}
    assert {"threshold+dual", "preset:eb_eotp+dual(suffix)+eotp", "preset:eb_eotp+suffix window+eotp"} <= set(by)
    assert "preset:eb_eotp+eotp+eotp" not in "".join(by)   # the preset's EoTP is not added twice
    s = report["stack"]["speedups"]["threshold"]
    assert s["dual_cache"] == pytest.approx(by["threshold"]["seconds"] / by["threshold+dual"]["seconds"])
    assert s["window_stack_vs_baseline"] == pytest.approx(
        by["low_confidence"]["seconds"] / by["threshold+suffix window+eotp"]["seconds"])
    result = _bench("loop", "--quick", "--model", "tiny", "--best", "threshold", "--json", str(out))
    assert result.exit_code == 0, result.output
    loop = json.loads(out.read_text())["loop"]
    assert [(r["config"], r["batch"]) for r in loop["rows"]] == [
        ("low_confidence", 1), ("low_confidence", 2), ("threshold+dual(suffix)+eotp", 1),
        ("threshold+dual(suffix)+eotp", 2)]
    assert all(r["tokens_per_second"] == pytest.approx(16 * 2 / r["seconds"]) for r in loop["rows"])


def test_quick_gap_on_tiny():
    result = _bench("gap", "--quick", "--model", "tiny")
    assert result.exit_code == 0 and "oracle gap" in result.output, result.output


def test_quick_cache_on_tiny(tmp_path):
    out = tmp_path / "cache.json"
    result = _bench("cache", "--quick", "--model", "tiny", "--variant", "dual:prefix_look=64",
                    "--batch", "2", "--json", str(out))
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert [(r["batch"], r["cache"]) for r in report["rows"]] == [
        (2, name) for name in ("none", "prefix", "dual", "d2", "elastic", "suffix", "suffix:mode=dpad",
                               "dual:prefix_look=64")]
    variant = report["options"]["caches"]["dual:prefix_look=64"]
    assert variant["name"] == "dual" and variant["prefix_look"] == 64
    assert report["options"]["caches"]["suffix:mode=dpad"]["mode"] == "dpad"
    rows = {r["cache"]: r for r in report["rows"]}
    assert rows["dual"]["vs_dual"] == 1.0 and "vs_dual" in result.output
    assert rows["d2"]["vs_dual"] == pytest.approx(rows["dual"]["seconds_per_sample"] / rows["d2"]["seconds_per_sample"])


def test_cache_variant_replaces_a_default_new_cache_and_new_caches_can_be_left_out(tmp_path):
    out = tmp_path / "cache.json"
    result = _bench("cache", "--quick", "--model", "tiny", "--variant", "d2:current_k=4", "--variant",
                    "elastic", "--no-new-caches", "--batch", "1", "--json", str(out))
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert [r["cache"] for r in report["rows"]] == ["none", "prefix", "dual", "d2:current_k=4", "elastic"]


def test_quick_scaling_on_tiny(tmp_path):
    out = tmp_path / "scaling.json"
    result = _bench("scaling", "--quick", "--model", "tiny", "--json", str(out))
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["lengths"] == [16, 32, 64] and "fitted exponent" in result.output
    for name, fit in report["exponents"].items():
        mine = [r["seconds_per_sample"] for r in report["rows"] if r["config"] == name]
        assert fit["16-64"] == pytest.approx(fit_exponent([16, 32, 64], mine))


@pytest.mark.parametrize("args,hint", [
    (["schedulers", "--gen-length", "12"], "multiple of block_length"),
    (["stack", "--best", "nosuch"], "unknown scheduler-table row"),
    (["cache", "--variant", "nosuch"], "--variant"),
    (["cache", "--gen-length", "40"], "multiple of block_length"),
    (["schedulers", "--model", "ar:ar_target"], "not a masked diffusion LM"),
    (["spec", "--model", "ideal"], "not a masked diffusion LM"),
    (["scaling", "--gen-length", "4096"], "context"),
])
def test_bad_settings_are_usage_errors(args, hint):
    result = _bench(*args, "--quick", *(["--model", "tiny"] if "--model" not in args else []))
    assert result.exit_code == 2 and hint in result.output, result.output


def test_json_path_is_checked_before_any_work(tmp_path, monkeypatch):
    import dllm_decode.eval.bench.subject as subject

    monkeypatch.setattr(subject, "load_subject", lambda name: pytest.fail("loaded a model"))
    for sub in ("all", "cache", "scaling", "spec"):
        result = _bench(sub, "--quick", "--model", "tiny", "--json", str(tmp_path))
        assert result.exit_code == 2 and "is a directory" in result.output, result.output


@pytest.mark.slow
def test_quick_all_on_tiny(tmp_path):
    out = tmp_path / "all.json"
    result = _bench("all", "--quick", "--model", "tiny", "--json", str(out))
    assert result.exit_code == 0, result.output
    assert {"schedulers", "stack", "loop", "oracle_gap", "ar"} <= set(json.loads(out.read_text()))


@pytest.mark.slow
def test_quick_compile_on_tiny():
    """Compiling takes minutes on CPU."""
    result = _bench("compile", "--quick", "--model", "tiny")
    assert result.exit_code == 0 and "torch.compile" in result.output, result.output


def test_quick_spec():
    result = _bench("spec", "--quick", "--model", "tiny")
    assert result.exit_code == 0, result.output
    assert "plain AR greedy" in result.output and "dLLM drafter skipped" in result.output
