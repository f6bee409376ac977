"""Greedy equality on the shipped models: the embedded AR target verifying drafts of the embedded
AR draft, prompt lookup, its own first layers, and the embedded dLLM (same tokenizer).

Skipped while the embedded models are not installed.
"""

from __future__ import annotations

import pytest
import torch

from dllm_decode.models import ModelLoadError, load_model
from dllm_decode.models.checkpoint import EMBEDDED_DIR
from dllm_decode.speculative import (CompactCausalLM, DiffusionDrafter, HeuristicScheduler, LookupDrafter,
                                     ModelDrafter, SpecConfig, layerskip_drafter,
                                     speculative_generate)
from dllm_decode.models.causal import load_causal_lm
from dllm_decode.schedulers import LowConfidenceScheduler, ThresholdScheduler

pytestmark = pytest.mark.skipif(
    not all((EMBEDDED_DIR / name / "config.json").is_file() for name in ("ar_target", "ar_draft")),
    reason="embedded AR models not installed")

PROMPTS = ("sort : mia ella hank =", "copy : lucy eric kevin paul =", "reverse : bella colin james =")


@pytest.fixture(scope="module")
def models():
    target, draft = load_causal_lm("ar_target"), load_causal_lm("ar_draft")
    try:
        dllm = load_model("embedded")
    except ModelLoadError:
        dllm = None
    return target, draft, dllm


def test_embedded_greedy_equality(models):
    target, draft, dllm = models
    tokenizer = target.tokenizer
    sep = tuple(tokenizer("=", add_special_tokens=False)["input_ids"])
    compact_target = CompactCausalLM(target)
    drafters = {"draft model": ModelDrafter(draft), "lookup": LookupDrafter(),
                "layer skip": layerskip_drafter(target, "2"),
                "compact draft model": ModelDrafter(CompactCausalLM(draft))}
    if dllm is not None:
        drafters["dLLM"] = DiffusionDrafter(dllm, ThresholdScheduler(0.7), drop_ids=sep)
    for prompt in PROMPTS:
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        out = target.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False,
                              pad_token_id=tokenizer.pad_token_id)
        reference = out[0, len(ids):].tolist()
        for name, drafter in drafters.items():
            for scheduler in (HeuristicScheduler(), LowConfidenceScheduler(steps_per_block=1)):
                for verifier in (target, compact_target):
                    result = speculative_generate(verifier, ids, SpecConfig(scheduler, max_new_tokens=16),
                                                  drafter)
                    assert result.tokens.tolist() == reference, (prompt, name)
