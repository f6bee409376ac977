"""`regional` capture: one transformer block compiled per bucket and reused for every layer (the
layer's tensors are its arguments), the step around it as written; on CUDA the step is then
recorded into a CUDA graph (`tests/test_gpu.py` runs that part). Here: the compiled block is
traced once per bucket, never recompiled for another layer, and the tokens are eager's."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from dllm_decode.caches import CACHES
from dllm_decode.capture import GraphCache
from dllm_decode.config import DecodeConfig
from dllm_decode.sampler import generate
from dllm_decode.schedulers import SCHEDULERS
from dllm_decode.testing import tiny_llada
from tests.test_capture import strict_dynamo  # noqa: F401  (the fixture)

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12]]


@pytest.mark.parametrize("rule,cache", [("threshold", "dual"), ("low_confidence", "none")])
def test_one_compiled_block_serves_every_layer(strict_dynamo, rule, cache):
    model = tiny_llada(layers=3)
    config = DecodeConfig(scheduler=SCHEDULERS[rule](), cache=CACHES[cache](), gen_length=8,
                          block_length=4, stop_at_eos=False)
    graphs = GraphCache("regional", backend="eager")
    captured = generate(model, PROMPTS, config, capture=graphs)
    eager = generate(model, PROMPTS, config)
    assert torch.equal(captured.tokens, eager.tokens) and torch.equal(captured.nfe, eager.nfe)
    assert not counters["graph_break"], dict(counters["graph_break"])
    # one block graph per bucket: three layers, no second trace (a recompile would raise)
    assert counters["stats"]["unique_graphs"] == len(graphs.entries) >= 1


@pytest.mark.slow
def test_regional_inductor_equals_eager(strict_dynamo):
    model = tiny_llada(layers=2)
    config = DecodeConfig(scheduler=SCHEDULERS["threshold"](), cache=CACHES["dual"](), gen_length=8,
                          block_length=4)
    assert torch.equal(generate(model, PROMPTS, config, capture="regional").tokens,
                       generate(model, PROMPTS, config).tokens)
