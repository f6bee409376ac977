"""`bench shaped`: the GPU-path benchmark runs end to end on the CPU at a small shape."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from dllm_decode.cli import main
from dllm_decode.eval.bench.shaped import ShapedOptions, prompts_for, shaped_model
from dllm_decode.eval.bench.timing import forward_timer


def test_quick_run_reports_every_cache_and_batch(tmp_path, one_thread):
    out = tmp_path / "shaped.json"
    result = CliRunner().invoke(main, ["bench", "shaped", "--quick", "--layers", "1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    rows = {(r["cache"], r["batch"]): r for r in report["rows"]}
    assert set(rows) == {(c, b) for c in ("none", "prefix", "dual") for b in (1, 2)}
    for row in rows.values():
        assert row["nfe"] == 4.0                      # 2 blocks x 2 steps, whatever the cache
        assert 0.0 <= row["overhead"] < 1.0 and row["tokens_per_second"] > 0
    assert rows[("none", 1)]["vs_none"] == 1.0
    assert report["options"]["layers"] == 1
    assert {r["runtime"] for r in report["rows"]} == {"reference"}


def test_compact_runtime_rows_beside_the_reference(tmp_path, one_thread):
    out = tmp_path / "shaped.json"
    result = CliRunner().invoke(main, ["bench", "shaped", "--quick", "--layers", "1", "--cache", "none",
                                       "--cache", "dual", "--runtime", "reference", "--runtime",
                                       "compact", "--json", str(out)])
    assert result.exit_code == 0, result.output
    rows = {(r["runtime"], r["cache"], r["batch"]): r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {(r, c, b) for r in ("reference", "compact") for c in ("none", "dual") for b in (1, 2)}
    for (runtime, cache, batch), row in rows.items():
        assert row["nfe"] == 4.0 and row["vs_reference"] > 0
        reference = rows[("reference", cache, batch)]
        assert row["vs_reference"] == pytest.approx(reference["seconds"] / row["seconds"])
    assert "vs reference" in result.output and "compact" in result.output


def test_shape_and_prompts():
    options = ShapedOptions(shape="embedded", layers=2, dtype="float32")
    model = shaped_model(options)
    assert len(model.model.transformer["blocks"]) == 2 and model.config.d_model == 192
    prompts = torch.tensor(prompts_for(model, options, 3))
    assert prompts.shape == (3, options.prompt_length)
    assert not torch.isin(prompts, torch.tensor([model.mask_token_id, *model.eos_token_ids])).any()


@pytest.mark.parametrize("bad", [dict(shape="gpt"), dict(layers=0), dict(batch_sizes=()),
                                 dict(gen_length=30, block_length=16), dict(caches=("d2",)),
                                 dict(runtimes=()), dict(runtimes=("fast",)), dict(variants=()),
                                 dict(variants=("graphs",)), dict(prompts=0),
                                 dict(steps_per_block=33, block_length=32)])
def test_bad_options_are_refused(bad):
    with pytest.raises(ValueError):
        ShapedOptions(**bad)


def test_forward_timer_syncs_around_each_forward():
    calls = []
    model = torch.nn.Linear(2, 2)
    with forward_timer(model, sync=lambda: calls.append("sync")) as spent:
        model(torch.zeros(1, 2))
    assert calls == ["sync", "sync"] and spent[1] == 1


def test_rows_carry_the_floor_column_and_the_captured_variant(tmp_path, one_thread):
    """Every available row has its floor columns (on the CPU: "unknown device", never a guess);
    the block cache decodes the block model; a captured row either runs or says why not."""
    out = tmp_path / "shaped.json"
    result = CliRunner().invoke(main, ["bench", "shaped", "--quick", "--layers", "1", "--batch", "1",
                                       "--cache", "none", "--cache", "block", "--step", "eager",
                                       "--step", "captured", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["peaks"] == "unknown device" and "floor ms" in result.output
    rows = {(r["variant"], r["cache"]): r for r in report["rows"]}
    assert set(rows) == {(v, c) for v in ("eager", "captured") for c in ("none", "block")}
    for cache in ("none", "block"):
        eager = rows[("eager", cache)]
        assert eager["available"] and eager["floor_ms"] is None and eager["floor_note"] == "unknown device"
        captured = rows[("captured", cache)]
        assert captured["available"] or captured["note"].startswith("not available")
    assert rows[("eager", "block")]["model"] == "block" and rows[("eager", "none")]["model"] == "llada"
    assert rows[("eager", "block")]["nfe"] == 6.0       # 3 grid blocks (prompt 8, block 16) x 2 steps
    assert set(report["parameters"]) == {"llada", "block"}


def test_block_model_shape_is_fast_dllm_v2_beside_llada_8b():
    from dllm_decode.eval.bench.roofline import ModelShape

    model = shaped_model(ShapedOptions(shape="llada-8b", dtype="bfloat16", device="meta"), "block")   # no memory
    shape = ModelShape.of(model)
    assert (shape.layers, shape.width, shape.kv_width) == (28, 3584, 512)     # Qwen2.5-7B, GQA 28/4
    assert model.block_size == 32


def test_torch_free_choices_mirror_their_constants():
    from dllm_decode.capture import CAPTURE_MODES
    from dllm_decode.eval.bench.benchmarks.shaped import BENCHMARK
    from dllm_decode.eval.bench.shaped import CACHES, RUNTIMES, VARIANTS

    kinds = {o.dest: o.kind for o in BENCHMARK.options}
    assert kinds["caches"] == CACHES and kinds["runtimes"] == RUNTIMES and kinds["variants"] == VARIANTS
    assert kinds["capture"] == ("auto", *CAPTURE_MODES[1:])


@pytest.mark.parametrize("family", ["llada", "block"])
def test_random_weights_give_spread_logits(family):
    """Norm scales are ones, weights and biases random: the logits are not flat, so greedy tokens
    differ by position and a token comparison between two loops means something."""
    options = ShapedOptions(shape="embedded", dtype="float32")
    model = shaped_model(options, family)
    prompt = torch.tensor(prompts_for(model, options, 1))
    with torch.inference_mode():
        logits = model(prompt)
    assert logits.std() > 0.1 and len(set(logits.argmax(-1)[0].tolist())) > 3


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA graphs can run on this machine")
def test_a_selection_with_nothing_to_run_is_a_usage_error():
    # only captured rows asked for, with a capture this device cannot run: one line, exit 2
    result = CliRunner().invoke(main, ["bench", "shaped", "--quick", "--layers", "1", "--cache", "none",
                                       "--capture", "cuda-graphs", "--step", "captured"])
    assert result.exit_code == 2 and "nothing to run" in result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)


def test_captured_rows_record_every_bucket_before_timing(monkeypatch, one_thread):
    """A captured row's graphs (one per batch bucket) are made in the warm-up at every batch size
    it runs, never inside a timed run, so large-batch rows time replays, not recordings."""
    from dllm_decode.capture import GraphCache
    from dllm_decode.eval.bench import shaped

    caches, at_timing = [], []
    made = GraphCache.__init__

    def keep(self, *args, **kwargs):
        made(self, *args, **kwargs)
        caches.append(self)

    def timed(plans, repeats, make):
        at_timing.append([g.captures for g in caches])
        return interleave(plans, repeats, make)

    interleave = shaped.interleave
    monkeypatch.setattr(GraphCache, "__init__", keep)
    monkeypatch.setattr(shaped, "interleave", timed)
    options = ShapedOptions(shape="embedded", layers=1, batch_sizes=(1, 4), prompt_length=8, gen_length=16,
                            block_length=8, caches=("dual",), runtimes=("compact",),
                            variants=("eager", "captured"), repeats=1, capture="static")
    report = shaped.run_shaped(options)
    assert caches and at_timing[0] == [g.captures for g in caches] and at_timing[0][0] > 0
    captured = [r for r in report["rows"] if r["variant"] == "captured"]
    assert all(r["identical_tokens"] and r["token_agreement"] == 1.0 for r in captured)


def test_token_agreement_is_a_fraction_and_printed_as_one():
    from dllm_decode.eval.bench.shaped import _agreement

    assert _agreement([[1, 2, 3, 4]], [[1, 2, 0, 4]]) == 0.75
    assert _agreement([[1, 2]], [[1, 2, 3]]) is None
