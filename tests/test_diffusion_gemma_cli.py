"""The command line on a DiffusionGemma checkpoint: the shipped decoding by default, a named
rule on the same canvas, streaming and a requests file through the running batch."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dllm_decode.cli import main
from dllm_decode.testing import tiny_tokenizer
from tests.models.gemma_reference import write_reference

pytest.importorskip("transformers.models.diffusion_gemma")


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gemma")
    write_reference(directory)
    tiny_tokenizer().save_pretrained(str(directory))       # ids 0..36: inside the vocabulary of 128
    (directory / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": 35, "pad_token_id": 35, "max_denoising_steps": 4, "max_new_tokens": 16}))
    return directory


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_decode_uses_the_shipped_decoding(gemma_dir):
    result = run("--model", str(gemma_dir), "--prompt", "w1 w2", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(next(line for line in result.output.splitlines() if line.startswith("{")))
    assert out["config"]["scheduler"] == {"name": "uniform_noise", "entropy_bound": 0.1, "steps": 4,
                                          "t_min": 0.4, "t_max": 0.8, "stability_threshold": 1,
                                          "confidence_threshold": 0.005}
    assert (out["config"]["gen_length"], out["config"]["block_length"]) == (16, 8)
    assert len(out["tokens"]) == 16 and 2 <= out["nfe"] <= 2 + 2 * 4


def test_a_named_rule_runs_on_the_canvas(gemma_dir):
    result = run("--model", str(gemma_dir), "--prompt", "w1 w2", "--json", "--scheduler", "eb")
    assert result.exit_code == 0, result.output
    bad = run("--model", str(gemma_dir), "--prompt", "w1 w2", "--scheduler", "wino")
    assert bad.exit_code == 2 and "does not run on a noise canvas" in bad.output


def test_stream_prints_the_same_answer(gemma_dir):
    whole = run("--model", str(gemma_dir), "--prompt", "w1 w2 w3")
    streamed = run("--model", str(gemma_dir), "--prompt", "w1 w2 w3", "--stream")
    assert whole.exit_code == 0 and streamed.exit_code == 0, streamed.output
    assert streamed.output.strip() == whole.output.strip()


def test_a_requests_file_equals_one_by_one_decoding(gemma_dir, tmp_path):
    """The running batch on noise canvases: three requests of different lengths, two at a time
    (each with its own generator), equal to each decoded alone."""
    prompts = ["w1 w2", "w3 w4 w5 w6", "w7"]
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(row) + "\n" for row in [
        {"id": "a", "prompt": prompts[0]}, {"id": "b", "prompt": prompts[1]},
        {"id": "c", "prompt": prompts[2]}]))
    result = run("--model", str(gemma_dir), "--input", str(src), "--output", str(out), "--batch-size", "2")
    assert result.exit_code == 0, result.output
    rows = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    singles = [json.loads(run("--model", str(gemma_dir), "--prompt", p, "--json").output) for p in prompts]
    assert [rows[k]["text"] for k in "abc"] == [one["text"] for one in singles]


def test_eval_runs_on_the_noise_canvas(gemma_dir, tmp_path):
    result = run("eval", "--model", str(gemma_dir), "--tasks", "copy", "--limit", "1", "--gen-length", "16",
                 "--scheduler", "uniform_noise:steps=2", "--scheduler", "threshold", "--no-plots",
                 "--out", str(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert {row["config"]["scheduler"]["name"] for row in rows} == {"uniform_noise", "threshold"}
    assert all(row["decode_config"]["block_length"] == 8 for row in rows)      # the canvas


def test_compile_runs_the_same_answer_or_says_why_not(gemma_dir):
    """`--compile` on a noise model: its decoder forward is the captured one, or (experts in
    their `loop` form) it runs eagerly with one warning line; the answer is the same either way."""
    whole = run("--model", str(gemma_dir), "--prompt", "w1 w2 w3")
    compiled = run("--model", str(gemma_dir), "--prompt", "w1 w2 w3", "--compile")
    assert whole.exit_code == 0 and compiled.exit_code == 0, compiled.output
    assert whole.output.strip() in compiled.output
