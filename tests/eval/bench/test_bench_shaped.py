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
                                 dict(gen_length=30, block_length=16), dict(caches=("block",)),
                                 dict(runtimes=()), dict(runtimes=("fast",))])
def test_bad_options_are_refused(bad):
    with pytest.raises(ValueError):
        ShapedOptions(**bad)


def test_forward_timer_syncs_around_each_forward():
    calls = []
    model = torch.nn.Linear(2, 2)
    with forward_timer(model, sync=lambda: calls.append("sync")) as spent:
        model(torch.zeros(1, 2))
    assert calls == ["sync", "sync"] and spent[1] == 1
