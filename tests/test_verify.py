"""`dllm-decode verify`: passes on each family's reference checkpoint (DiffusionGemma against
transformers' class, a BERT masked LM against its own class, LLaDA, Dream, Fast-dLLM v2, SDAR and
LLaDA2 against the modeling file shipped in their folder), fails (exit 1) on deliberately broken ports,
and refuses (exit 2, one line) a checkpoint it has no reference for or no opt-in to run."""

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

    make_llada().save_pretrained(tmp_path / "llada")                 # no modeling code shipped
    result = run("--model", str(tmp_path / "llada"), "--trust-remote-code")
    assert result.exit_code == 2 and "names none (no auto_map" in result.output
    tiny_block_diffusion("sdar").save_pretrained(tmp_path / "sdar")
    result = run("--model", str(tmp_path / "sdar"))
    assert result.exit_code == 2 and "model_type 'sdar'" in result.output
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    result = run("--model", str(tmp_path / "gpt2"))
    assert result.exit_code == 2 and "no reference for model_type 'gpt2'" in result.output


# ---- every family, against the reference its folder names --------------------------------------

REMOTE = ["llada", "dream", "fast_dllm", "sdar", "llada2"]


@pytest.fixture(autouse=True)
def modules_cache(tmp_path_factory, monkeypatch):
    """Remote code is imported from a cache under the test's folder, never ~/.cache."""
    import transformers.dynamic_module_utils as dynamic

    monkeypatch.setattr(dynamic, "HF_MODULES_CACHE", str(tmp_path_factory.getbasetemp() / "hf_modules"))


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    from tests.verify_checkpoints import WRITERS

    root = tmp_path_factory.mktemp("families")
    out = {}
    for name, write in WRITERS.items():
        (root / name).mkdir()
        out[name] = write(root / name)
    return out


@pytest.mark.parametrize("family", [*REMOTE, "masked_lm"])
def test_passes_on_every_familys_reference(family, family_dirs):
    opt_in = [] if family == "masked_lm" else ["--trust-remote-code"]     # BERT: transformers' own class
    result = run("--model", str(family_dirs[family]), "--json", *opt_in)
    assert result.exit_code == 0, result.output
    report = report_of(result)
    checks = {c["name"]: c for c in report["checks"]}
    assert report["ok"] and list(checks) == ["logits", "greedy predictions"]
    assert 0 <= checks["logits"]["value"] <= checks["logits"]["tolerance"]
    assert checks["greedy predictions"]["detail"].startswith("24/24")
    expected = "BertForMaskedLM" if family == "masked_lm" else "modeling_ref.RefModel"
    assert report["reference"].endswith(expected)


@pytest.mark.parametrize("family", REMOTE)
def test_own_code_runs_only_with_the_opt_in(family, family_dirs):
    result = run("--model", str(family_dirs[family]))
    assert result.exit_code == 2 and "pass --trust-remote-code" in result.output
    assert sum(line.startswith("Error:") for line in result.output.splitlines()) == 1


def test_fails_on_a_port_with_one_weight_off(family_dirs, monkeypatch):
    import dllm_decode.models.loading as loading

    load = loading.load_model

    def perturbed(*args, **kwargs):                   # a port that reads one weight wrong
        model = load(*args, **kwargs)
        with torch.no_grad():
            next(p for n, p in model.named_parameters() if "q_proj" in n)[0, 0] += 0.05
        return model

    monkeypatch.setattr(loading, "load_model", perturbed)
    result = run("--model", str(family_dirs["llada"]), "--trust-remote-code")
    assert result.exit_code == 1, result.output
    assert "FAIL logits" in result.output


def test_fails_on_a_port_that_forgot_the_token_shift(family_dirs, monkeypatch):
    from dllm_decode.models import FastDLLMModel

    monkeypatch.setattr(FastDLLMModel, "token_shift", 0)
    result = run("--model", str(family_dirs["fast_dllm"]), "--trust-remote-code", "--json")
    assert result.exit_code == 1, result.output
    assert {c["name"]: c["ok"] for c in report_of(result)["checks"]}["logits"] is False


def test_fails_on_a_port_with_the_wrong_block_size(family_dirs, monkeypatch):
    import dllm_decode.models.loading as loading

    load = loading.load_model

    def wider(*args, **kwargs):                       # a port that read the block size wrong
        model = load(*args, **kwargs)
        model.block_size *= 2
        return model

    monkeypatch.setattr(loading, "load_model", wider)
    result = run("--model", str(family_dirs["sdar"]), "--trust-remote-code")
    assert result.exit_code == 1 and "FAIL logits" in result.output


def test_fails_on_a_moe_port_without_group_limited_routing(family_dirs, monkeypatch):
    import dllm_decode.models.llada2 as port

    monkeypatch.setattr(port, "group_limited_topk", lambda scores, k, n_group, topk_group: scores.topk(k, -1).indices)
    result = run("--model", str(family_dirs["llada2"]), "--trust-remote-code")
    assert result.exit_code == 1 and "FAIL logits" in result.output
