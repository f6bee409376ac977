"""The shipped uniform-noise model, `embedded-noise` (`dllm_decode/embedded/noise`, trained by
`recipes/noise.py`): it loads by name, its shipped decoding is the family's sampler, the CLI
decodes with it, transformers' own class agrees with the port on it, and it solves a fixed
sample of the test split at a stated accuracy."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from dllm_decode import DecodeConfig, generate, load_model
from dllm_decode.models.checkpoint import EMBEDDED_DIR, EMBEDDED_NAMES, resolve_model_dir
from dllm_decode.models.diffusion_gemma import DiffusionGemmaModel

MIN_ACCURACY = 0.5
"""The floor on the fixed sample below (2 test prompts per task, 24 in all, seed 0): the shipped
model solves 14 of 24 (58%; 54.0% on 1,200 test prompts, `measurements/cpu_2026-11-29-noise`),
so the floor leaves 2 prompts of margin for rounding across machines. Random weights score 0."""


@pytest.fixture(scope="module")
def model():
    return load_model("embedded-noise")


def test_loads_by_name_with_its_shipped_decoding(model):
    assert resolve_model_dir("embedded-noise") == EMBEDDED_DIR / EMBEDDED_NAMES["embedded-noise"]
    assert isinstance(model, DiffusionGemmaModel) and model.canvas_kind == "noise"
    assert model.canvas_length == 8 and model.vocab_size == 129 and model.eos_token_ids == (2,)
    config = DecodeConfig.for_model(model, gen_length=32)
    assert config.to_dict()["scheduler"]["name"] == "uniform_noise" and config.block_length == 8
    assert (config.scheduler.steps, config.scheduler.entropy_bound) == (16, 0.1)


def test_reaches_the_stated_accuracy(model):
    """Each task's first two test prompts (`prompt =`, the format it was trained on), decoded with
    the shipped decoding and seed 0; scored by the task's own scorer."""
    from dllm_decode.eval.tasks import TASKS

    examples = [e for name in sorted(TASKS) for e in TASKS[name].examples("test", 2, 0)]
    config = DecodeConfig.for_model(model, gen_length=32)
    result = generate(model, [e.prompt + " =" for e in examples], config,
                      generator=torch.Generator().manual_seed(0))
    score = sum(TASKS[e.task].score(e, text) for e, text in zip(examples, result.text)) / len(examples)
    assert score >= MIN_ACCURACY
    assert float(result.nfe.float().mean()) < 4 * 17          # at most 4 canvases x (encode + 16 steps)


def test_decodes_through_the_cli():
    from dllm_decode.cli import main

    run = CliRunner().invoke(main, ["--model", "embedded-noise", "--json", "--prompt", "copy : alice bob carol"])
    assert run.exit_code == 0, run.output
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["text"] == "alice bob carol"
    assert out["config"]["scheduler"]["name"] == "uniform_noise" and out["nfe"] >= 2


@pytest.mark.slow
def test_transformers_reads_the_same_model():
    """`verify` (transformers' DiffusionGemmaForBlockDiffusion against the port) passes on it."""
    from dllm_decode.verify import verify

    report = verify("embedded-noise")
    assert report.ok, report.to_dict()


def test_the_masked_benchmark_suite_refuses_it_in_one_line():
    from dllm_decode.cli import main

    run = CliRunner().invoke(main, ["bench", "schedulers", "--model", "embedded-noise", "--quick"])
    assert run.exit_code == 2 and "is a uniform-noise model" in run.output
    assert "Traceback" not in run.output
