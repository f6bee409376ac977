"""The real pretrained check: SmolLM2-135M-Instruct (fetched GGUF, de-quantised to float32).

Slow (loading and 30+ forwards of a 135M model on CPU); skipped when the GGUF was not fetched
(`dllm-decode fetch smollm2`).
"""

from __future__ import annotations

import pytest
import torch

from dllm_decode.speculative import (LookupDrafter, ModelDrafter, SpecConfig, layerskip_drafter,
                                     speculative_generate)
from dllm_decode.models.gguf import gguf_path
from dllm_decode.schedulers import LowConfidenceScheduler, ThresholdScheduler

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not gguf_path().is_file(), reason="SmolLM2 GGUF not fetched")]

QUESTION = "List the first five planets of the solar system, separated by commas."
NEW = 24


@pytest.fixture(scope="module")
def smollm2():
    from dllm_decode.models.causal import load_causal_lm

    return load_causal_lm("smollm2")


def test_greedy_equality(smollm2):
    tokenizer = smollm2.tokenizer
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}],
                                           add_generation_prompt=True, tokenize=False)
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    reference = smollm2.generate(ids, max_new_tokens=NEW, do_sample=False)[0, ids.shape[1]:].tolist()
    eos = tokenizer.eos_token_id
    reference = reference[:reference.index(eos) + 1] if eos in reference else reference
    constant = LowConfidenceScheduler(steps_per_block=1)
    for drafter, scheduler in ((LookupDrafter(), constant),
                               (layerskip_drafter(smollm2, "20"), ThresholdScheduler(0.3)),
                               (ModelDrafter(smollm2), constant)):
        result = speculative_generate(smollm2, prompt, SpecConfig(scheduler, max_new_tokens=NEW,
                                                                  max_draft=4), drafter)
        assert result.tokens.tolist() == reference, type(drafter).__name__
    assert torch.is_floating_point(next(smollm2.parameters()))
