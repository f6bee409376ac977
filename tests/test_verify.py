"""`dllm-decode verify`: passes on a reference checkpoint, fails (exit 1) on a deliberately
broken port, and refuses (exit 2, one line) a checkpoint it has no reference for."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from dllm_decode.cli import main
from tests.models.gemma_reference import write_reference

pytest.importorskip("transformers.models.diffusion_gemma")


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gemma")
    write_reference(directory)
    shipped = json.loads((directory / "generation_config.json").read_text())
    shipped["max_denoising_steps"] = 4            # the checkpoint's own (short) schedule
    (directory / "generation_config.json").write_text(json.dumps(shipped))
    return directory


def report_of(result):
    return json.loads(next(line for line in result.output.splitlines() if line.startswith("{")))


def run(*args):
    return CliRunner().invoke(main, ["verify", *args])


def test_passes_on_the_reference_checkpoint(gemma_dir):
    result = run("--model", str(gemma_dir), "--json")
    assert result.exit_code == 0, result.output
    report = report_of(result)
    assert report["ok"] and [c["name"] for c in report["checks"]] == ["logits", "seeded decode"]
    assert report["checks"][0]["value"] <= report["checks"][0]["tolerance"]
    assert report["checks"][1]["detail"].startswith("48/48 tokens agree")


def test_fails_on_a_broken_port(gemma_dir, monkeypatch):
    import dllm_decode.models.gemma_layers as port

    def no_expert_scale(self, h):                 # a port that forgot `per_expert_scale`
        x = port.gemma_rms_norm(h, None, self.cfg.rms_norm_eps) * self.scale * self.cfg.hidden_size ** -0.5
        weights, experts = torch.topk(torch.softmax(self.proj(x), -1, dtype=torch.float32),
                                      k=self.cfg.top_k_experts, dim=-1)
        return experts, weights / weights.sum(-1, keepdim=True)

    monkeypatch.setattr(port.GemmaRouter, "forward", no_expert_scale)
    result = run("--model", str(gemma_dir))
    assert result.exit_code == 1, result.output
    assert "FAIL logits" in result.output and "PASS seeded decode" not in result.output


def test_fails_on_a_port_that_samples_differently(gemma_dir, monkeypatch):
    from dllm_decode.noise import NoiseSchedule

    monkeypatch.setattr(NoiseSchedule, "temperature", lambda self, remaining: torch.tensor(self.t_max))
    result = run("--model", str(gemma_dir), "--json")
    assert result.exit_code == 1, result.output
    checks = {c["name"]: c["ok"] for c in report_of(result)["checks"]}
    assert checks == {"logits": True, "seeded decode": False}


def test_refuses_what_it_cannot_verify(tmp_path):
    from tests.models.conftest import make_llada
    from dllm_decode.testing import tiny_block_diffusion

    make_llada().save_pretrained(tmp_path / "llada")
    result = run("--model", str(tmp_path / "llada"))
    assert result.exit_code == 2 and "--trust-remote-code" in result.output
    tiny_block_diffusion("sdar").save_pretrained(tmp_path / "sdar")
    result = run("--model", str(tmp_path / "sdar"))
    assert result.exit_code == 2 and "no reference for model_type 'sdar'" in result.output
