"""`bench bd`: rows, figures and options of the block-diffusion comparison."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dllm_decode.cli import main
from dllm_decode.eval.bench.blockdiff import AR_LABEL, BlockDiffOptions, answer_length
from dllm_decode.models.checkpoint import EMBEDDED_DIR


def test_answer_length_stops_at_the_first_end_of_text():
    assert answer_length([5, 6, 2, 7, 2], (2,)) == 2
    assert answer_length([5, 6], (2,)) == 2
    assert answer_length([9, 5], (2, 9)) == 0


@pytest.mark.parametrize("changes", [dict(per_task=0), dict(repeats=0), dict(gen_lengths=()),
                                     dict(gen_lengths=(4,)), dict(threshold=0.0), dict(threshold=1.5)])
def test_bad_options_are_refused(changes):
    with pytest.raises(ValueError):
        BlockDiffOptions(**changes)


@pytest.mark.slow
@pytest.mark.skipif(not (EMBEDDED_DIR / "bd" / "config.json").is_file(), reason="embedded-bd not installed")
def test_quick_run_on_the_shipped_models(tmp_path):
    out = tmp_path / "bd.json"
    result = CliRunner().invoke(main, ["bench", "bd", "--quick", "--json", str(out)])
    assert result.exit_code == 0, result.output
    rows = {r["label"]: r for r in json.loads(out.read_text())["rows"]}
    assert next(iter(rows)) == AR_LABEL and rows[AR_LABEL]["speedup_vs_ar"] == pytest.approx(1.0)
    cached, plain = rows["BD threshold 0.9 + block cache, gen 32"], rows["BD threshold 0.9, gen 32"]
    # The block cache is exact: same answers, same forwards.
    assert cached["accuracy"] == plain["accuracy"] and cached["forwards"] == plain["forwards"]
    for r in rows.values():
        assert r["forwards_per_answer_token"] == pytest.approx(r["forwards"] / r["answer_tokens"])
    # One token per step needs a forward per committed position: at least one per answer token.
    assert rows["BD one token per step + block cache, gen 32"]["forwards_per_answer_token"] >= 1.0
    assert "BD threshold" in result.output


def test_a_model_without_blocks_is_a_usage_error():
    result = CliRunner().invoke(main, ["bench", "bd", "--quick", "--model", "embedded"])
    assert result.exit_code == 2 and "not a block-diffusion model" in result.output
