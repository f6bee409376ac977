"""The captured decoder forward of DiffusionGemma (`dllm_decode.capture.denoise`): on bucketed
static buffers, eagerly (`static`) and compiled (`compile`, fullgraph, no recompile inside a
bucket), equal to `model.denoise` within the float tolerance; and a whole default decode run
through it token-identical to the eager decode.

Graph-break and recompile checks compile with `backend="eager"` (seconds); inductor is `-m slow`.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from dllm_decode.capture import GraphCache
from dllm_decode.capture.denoise import CapturedDenoise, denoise_problem
from dllm_decode.config import DecodeConfig
from dllm_decode.models.gemma_layers import set_moe_impl
from dllm_decode.sampler import generate
from dllm_decode.testing import assert_logits_close, tiny_diffusion_gemma
from tests.test_capture import strict_dynamo  # noqa: F401  (the fixture: recompiles are errors)

PROMPTS = [[5, 9, 4, 11, 7], [7, 2, 20], [3, 3, 8, 30, 31, 32]]


def _model():
    return set_moe_impl(tiny_diffusion_gemma(seed=0, steps=4), "static")


def _prompt():
    width = max(len(p) for p in PROMPTS)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in PROMPTS])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in PROMPTS])
    return ids, mask


def _steps(model, denoise) -> list[torch.Tensor]:
    """Two canvases (the cache grows past a sliding window between them), each two steps: without
    and with self-conditioning (on the same given logits for both paths: a path's own logits as
    input would compare two forwards' rounding, amplified by the softmax); a padded batch of 3
    (bucket 4)."""
    ids, mask = _prompt()
    generator = torch.Generator().manual_seed(3)
    cache, out = model.encode(ids, mask), []
    for _ in range(2):
        canvas = torch.randint(0, 128, (3, 8), generator=generator)
        previous = 4 * torch.randn(3, 8, 128, generator=generator)
        out += [denoise(canvas, cache), denoise(canvas, cache, previous)]
        cache = model.encode(canvas, None, cache)
    return out


@pytest.mark.parametrize("mode", ["static", "compile"])
def test_captured_forward_equals_eager(strict_dynamo, mode):
    model = _model()
    graphs = GraphCache(mode, backend="eager" if mode == "compile" else None, length_step=8)
    captured = CapturedDenoise(model, graphs)
    expected = _steps(model, model.denoise)
    got = _steps(model, captured.denoise)
    for a, b in zip(got, expected):
        assert_logits_close(a, b)
    # two canvases: the full layer's 5 then 6+8 cached keys fall in length buckets 8 and 16
    assert graphs.captures == 2 and len(graphs.buffers) == 2
    if mode == "compile":
        assert not counters["graph_break"], dict(counters["graph_break"])
        assert counters["stats"]["unique_graphs"] == graphs.captures


def test_a_default_decode_through_the_captured_forward_is_token_identical():
    model = _model()
    config = DecodeConfig.for_model(model, gen_length=24)
    expected = [generate(model, PROMPTS, config, generator=torch.Generator().manual_seed(s)).tokens
                for s in range(3)]
    graphs = GraphCache("static", length_step=8)   # the loop chooses the captured forward
    for s in range(3):
        tokens = generate(model, PROMPTS, config, generator=torch.Generator().manual_seed(s),
                          capture=graphs).tokens
        assert torch.equal(tokens, expected[s])
    assert graphs.captures >= 1                       # the decoder forward ran captured


def test_what_cannot_be_captured_is_named():
    loop = tiny_diffusion_gemma()
    assert "set_moe_impl(model, 'static')" in denoise_problem(loop)
    with pytest.raises(ValueError, match="syncs the host per layer"):
        CapturedDenoise(loop, GraphCache("static"))
    with pytest.raises(ValueError, match="'static', 'compile' or 'cuda-graphs'"):
        CapturedDenoise(_model(), GraphCache("regional"))


@pytest.mark.slow
def test_inductor_forward_equals_eager(strict_dynamo):
    model = _model()
    captured = CapturedDenoise(model, GraphCache("compile", length_step=8))
    for a, b in zip(_steps(model, captured.denoise), _steps(model, model.denoise)):
        assert_logits_close(a, b)
