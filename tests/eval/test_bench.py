"""`dllm-decode bench`: the quick configuration end to end, the forward timer, the oracle-gap
analysis on a model whose every prediction is known."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from click.testing import CliRunner

from dllm_decode.cli import main
from dllm_decode.config import DecodeConfig
from dllm_decode.sampler import generate
from dllm_decode.testing import OracleMaskPredictor, tiny_llada
from dllm_decode.eval.bench.measure import forward_timer
from dllm_decode.eval.bench.oracle_gap import token_waits
from dllm_decode.schedulers import SCHEDULERS, LowConfidenceScheduler


def test_quick_bench_on_tiny(tmp_path):
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(main, ["bench", "--quick", "--model", "tiny", "--section", "loop",
                                       "--section", "stack", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert "TINY" in report["model"] and report["machine"]["torch"] == torch.__version__
    rows = {r["label"]: r for r in report["schedulers"]["rows"]}
    assert set(SCHEDULERS) <= set(rows)
    # one token per step is the reference: the oracle commits at least as much every step
    assert rows["oracle"]["nfe"] <= rows["low_confidence"]["nfe"]
    assert rows["low_confidence"]["nfe_vs_baseline"] == 1.0 and rows["oracle"]["nfe_vs_oracle"] == 1.0
    assert all(0.0 <= r["overhead"] < 1.0 and r["accuracy"] is None for r in rows.values())
    batches = [r["batch"] for r in report["loop"]["rows"]]
    assert batches == [1, 2, 1, 2]
    assert report["stack"]["speedups"]["threshold"]["dual_cache"] > 0
    assert "targets:" in result.output
    stacks = [k for k in report["targets"] if k.startswith("full stack >= 15x")]
    assert len(stacks) == 2 and any("dual(suffix)" in k for k in stacks)


def test_bench_rejects_a_bad_length():
    result = CliRunner().invoke(main, ["bench", "--quick", "--model", "tiny", "--gen-length", "12"])
    assert result.exit_code == 2 and "multiple of block_length" in result.output


def test_forward_timer_counts_and_restores():
    model = tiny_llada(layers=1)
    config = DecodeConfig(scheduler=LowConfidenceScheduler(), gen_length=8, block_length=4)
    with forward_timer(model) as spent:
        result = generate(model, [[1, 2, 3]], config)
    assert spent[1] == int(result.nfe[0]) == 8 and spent[0] > 0
    assert "forward" not in vars(model)


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


def test_ar_section_with_tiny_causal_models(monkeypatch):
    """Greedy speculative decoding returns exactly the plain AR output; figures are filled in."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import dllm_decode.speculative.models as causal
    from dllm_decode.eval.bench import suite as bench
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
    subject = bench.load_subject("tiny")
    options = dataclasses.replace(bench.QUICK, ar_samples=1, ar_new_tokens=6)
    report = bench.section_ar(subject, bench.samples_for(subject, options), options)
    spec = report["rows"]["ar+speculative"]
    assert spec["same_output_as_ar"] == 100 and spec["speedup_vs_ar"] > 0
    assert report["rows"]["ar"]["target_forwards_per_token"] == 1.0
