"""GPU smoke tests: the loop, the caches and the shaped benchmark on CUDA.

Marked `gpu` (deselected by default: `python -m pytest -m gpu` runs them) and skipped on a machine
without CUDA. They check that the CUDA path runs and agrees with the CPU within float tolerance,
not its speed (`dllm-decode bench shaped --device cuda` measures that).
"""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from dllm_decode import DecodeConfig, generate
from dllm_decode.cli import main
from dllm_decode.modelspec import ModelSpec, load_diffusion
from dllm_decode.registry import component

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PROMPTS = ["sort : mia ella hank", "copy : alice bob carol"]


def models() -> tuple:
    spec = ModelSpec.parse("embedded")
    return load_diffusion(spec), load_diffusion(spec, device="cuda", dtype=torch.float32)


def test_forward_on_cuda_matches_the_cpu():
    cpu, cuda = models()
    ids = cpu.tokenizer(PROMPTS[0], add_special_tokens=False)["input_ids"]
    canvas = torch.tensor([ids + [cpu.mask_token_id] * 16])
    with torch.inference_mode():
        expected, got = cpu(canvas), cuda(canvas.cuda())
    assert got.device.type == "cuda"
    torch.testing.assert_close(got.float().cpu(), expected.float(), atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
def test_generate_on_cuda_agrees_with_the_cpu(cache):
    cpu, cuda = models()
    config = DecodeConfig(scheduler=component("scheduler", {"name": "threshold", "threshold": 0.9}),
                          cache=component("cache", {"name": cache}), gen_length=32, block_length=8)
    expected, got = generate(cpu, PROMPTS, config), generate(cuda, PROMPTS, config)
    agree = (got.tokens.cpu() == expected.tokens).float().mean().item()
    assert agree >= 0.95, f"{cache}: {agree:.2%} of tokens agree"      # near-ties may flip a token


def test_bench_shaped_quick_on_cuda(tmp_path):
    out = tmp_path / "shaped.json"
    result = CliRunner().invoke(main, ["bench", "shaped", "--quick", "--device", "cuda", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert "cuda" in json.dumps(report).lower() and report["rows"]


@pytest.mark.parametrize("mode", ["cuda-graphs", "regional"])
@pytest.mark.parametrize("cache", ["none", "dual"])
def test_cuda_graph_replay_equals_eager_tokens(cache, mode):
    """The captured step recorded per bucket and replayed decodes the eager tokens and NFE, and
    replays without a host sync (the loop's own one sync per step happens outside replay)."""
    from dllm_decode.capture import GraphCache

    _, model = models()
    config = DecodeConfig(scheduler=component("scheduler", "threshold"),
                          cache=component("cache", cache), gen_length=32, block_length=8)
    eager = generate(model, PROMPTS, config)
    graphs = GraphCache(mode)          # regional: one compiled block per bucket, recorded as a graph
    generate(model, PROMPTS, config, capture=graphs)          # records every bucket it needs
    replays = []
    original = GraphCache.run

    def counted_run(self, key, owner, args, fn=None):
        replays.append(key)
        return original(self, key, owner, args) if fn is None else original(self, key, owner, args, fn)

    GraphCache.run = counted_run
    graphs.strict = True             # a host sync anywhere in a whole captured call raises
    try:
        captured = generate(model, PROMPTS, config, capture=graphs)
    finally:
        GraphCache.run = original
        graphs.strict = False
    assert replays and graphs.pool_bytes >= 0
    assert torch.equal(captured.tokens.cpu(), eager.tokens.cpu())
    assert torch.equal(captured.nfe.cpu(), eager.nfe.cpu())


def test_cuda_graphs_sampled_runs_repeat():
    """Sampling noise is drawn outside the graph with the request's generator: same seed, same tokens."""
    _, model = models()
    config = DecodeConfig(scheduler=component("scheduler", "threshold"),
                          cache=component("cache", "dual"), gen_length=32, block_length=8,
                          temperature=0.8, seed=3)
    eager = generate(model, PROMPTS, config)
    assert torch.equal(generate(model, PROMPTS, config, capture="cuda-graphs").tokens.cpu(),
                       eager.tokens.cpu())
