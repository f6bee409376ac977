"""`dllm-decode eval --model ar:TARGET[+DRAFT]`: the AR speculative baseline through the runner."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from dllm_decode.cli import main

pytest.importorskip("dllm_decode.speculative")


def _tiny_causal(directory, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    from dllm_decode.eval.tasks.tokenizer import load_tokenizer

    tokenizer = load_tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=48,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=128, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.mark.slow
def test_ar_target_with_draft(tmp_path):
    target = _tiny_causal(tmp_path / "target", 0)
    draft = _tiny_causal(tmp_path / "draft", 1)
    result = CliRunner().invoke(main, [
        "eval", "--model", f"ar:{target}+{draft}", "--tasks", "copy", "--limit", "2",
        "--scheduler", "low_confidence", "--sweep", "steps_per_block=1,4", "--gen-length", "6",
        "--out", str(tmp_path / "out"), "--json", "--no-plots"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert {c["model"] for c in summary["configurations"]} == {f"ar:{target}+{draft}"}
    rows = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    for row in rows:       # every target forward appends at least one token, at most a draft + 1
        assert 1.0 <= row["tokens_per_step"] <= 7.0 and row["nfe"] >= 1 and row["draft_forwards"] >= 0


@pytest.mark.slow
def test_compact_target_runtime_gives_the_same_outputs_under_its_own_label(tmp_path):
    target = _tiny_causal(tmp_path / "target", 0)
    base = ["eval", "--tasks", "copy", "--limit", "2", "--scheduler", "low_confidence",
            "--gen-length", "6", "--out", str(tmp_path / "out"), "--json", "--no-plots"]
    for name in (f"ar:{target}", f"ar:{target}@compact"):
        result = CliRunner().invoke(main, base + ["--model", name], catch_exceptions=False)
        assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    by_model = {}
    for row in rows:
        by_model.setdefault(row["model"], []).append(row["output"])
    assert set(by_model) == {f"ar:{target}", f"ar:{target}@compact"}
    assert by_model[f"ar:{target}"] == by_model[f"ar:{target}@compact"]


def test_the_ar_baseline_refuses_a_cache_or_filter_it_would_ignore(tmp_path):
    for extra in (["--cache", "dual"], ["--filter", "eotp"]):
        result = CliRunner().invoke(main, ["eval", "--model", "ar:ar_target", "--tasks", "copy",
                                           "--limit", "1", "--out", str(tmp_path / "out"), *extra])
        assert result.exit_code == 2 and "apply to diffusion models" in result.output
        assert not (tmp_path / "out" / "samples.jsonl").exists()


def test_ar_rows_count_answer_tokens_per_forward_like_a_dllm(monkeypatch):
    """The AR point's primary speed is answer tokens (before the first end-of-text) per target
    forward, the dLLM unit; every appended token, the end-of-text too, is its tokens_per_step."""
    import types

    import dllm_decode.speculative as speculative
    from dllm_decode.eval.harness.grid import expand_grid
    from dllm_decode.eval.harness.runner import ar_decoder
    from dllm_decode.speculative import SpecResult

    def fake_generate(target, prompt, config, drafter, generator=None):
        return SpecResult(tokens=torch.tensor([5, 6, 7, 2]), appended=[3, 1], drafted=[2, 0],
                          matched=[2, 0], target_forwards=2, draft_forwards=2, seconds=0.01,
                          text="a b c")
    monkeypatch.setattr(speculative, "speculative_generate", fake_generate)
    target = types.SimpleNamespace(tokenizer=None, config=types.SimpleNamespace(eos_token_id=2))
    (setting,) = expand_grid([("low_confidence", {})], {}, [], gen_length=8)
    (row,), _ = ar_decoder(target)(["copy : a b c"], setting, 8, torch.Generator())
    assert row["answer_tokens_per_step"] == 1.5 and row["tokens_per_step"] == 2.0 and row["nfe"] == 2
