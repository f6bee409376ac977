"""Block-diffusion models decode on their block grid: a request must fit the model's context
with the grid tail counted (checked the same way at every entry point), and a token-shifted
model's block start is committed alone in its block's first step, even under an all-in finish."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dllm_decode import DecodeConfig, generate
from dllm_decode.caches import BlockCache, NoCache
from dllm_decode.engine import Engine
from dllm_decode.interfaces import Decision, Scheduler, StepInput
from dllm_decode.member import check_context
from dllm_decode.sampler import Decoding
from dllm_decode.schedulers import LowConfidenceScheduler
from dllm_decode.serving import Request
from dllm_decode.speculative.selfspec import self_speculative_generate
from dllm_decode.testing import tiny_block_diffusion

BLOCK = 4


@pytest.fixture(scope="module")
def fast_dllm():
    model = tiny_block_diffusion("fast_dllm", seed=5, block_size=BLOCK, max_length=14)
    assert model.block_start_first and model.max_length == 14
    return model


# ---- the context check counts the grid tail -----------------------------------------------------

def test_check_context_counts_the_grid_tail(fast_dllm):
    check_context(fast_dllm, 4, 8)                      # 12 positions: three whole blocks
    with pytest.raises(ValueError, match=r"whole blocks of 4, 16 positions.*context of 14 tokens "
                                         r"\(gen_length 7 at most fits\)"):
        check_context(fast_dllm, 5, 8)                  # 13 tokens, but the canvas runs to 16
    with pytest.raises(ValueError, match="no generation fits"):
        check_context(fast_dllm, 12, 1)
    with pytest.raises(ValueError, match=r"exceeds the model's context of 14 tokens$"):
        check_context(fast_dllm, 8, 8)                  # on the grid: the plain message


def test_every_entry_point_refuses_a_request_whose_grid_tail_overruns(fast_dllm):
    prompt = [3, 17, 5, 9, 11]                          # 5 + 8 = 13 <= 14, canvas 16 > 14
    config = DecodeConfig(scheduler=LowConfidenceScheduler(), gen_length=8, block_length=BLOCK)
    match = "whole blocks of 4, 16 positions"
    with pytest.raises(ValueError, match=match):
        generate(fast_dllm, [prompt], config)
    with pytest.raises(ValueError, match=match):
        Decoding(fast_dllm, NoCache()).add([prompt], config)
    with pytest.raises(ValueError, match=match):        # the batch CLI and the server check here
        Engine(fast_dllm, None).check(Request("r", tuple(prompt), config))
    with pytest.raises(ValueError, match=match):
        self_speculative_generate(fast_dllm, prompt, config)
    fits = DecodeConfig(scheduler=LowConfidenceScheduler(), gen_length=4, block_length=BLOCK)
    assert generate(fast_dllm, [prompt], fits).tokens.shape == (1, 4)


# ---- an all-in finish keeps the block-start rule ------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _FinishAtOnce(Scheduler):
    """Commits nothing itself and sets the all-in `finish` on every row at every step."""

    def select(self, inp: StepInput, state):
        return Decision(commit=torch.zeros_like(inp.eligible),
                        finish=torch.ones_like(inp.live)), state


@pytest.mark.parametrize("cache", [NoCache, BlockCache])
def test_finish_in_a_blocks_first_step_commits_the_block_start_alone(fast_dllm, cache):
    config = DecodeConfig(scheduler=_FinishAtOnce(), gen_length=8, block_length=BLOCK,
                          cache=cache(), stop_at_eos=False)
    result = generate(fast_dllm, [[3, 17, 5, 9]], config, trace=True)   # on the grid
    firsts = [entry for entry in result.trace if entry["block_step"] == 0]
    assert len(firsts) == 2
    for entry in firsts:
        committed = entry["commit"][0].nonzero().flatten().tolist()
        assert len(committed) == 1 and (entry["offset"] + committed[0]) % BLOCK == 0
    assert result.nfe.tolist() == [4]                   # then the finish fills the rest at once
    assert not (result.tokens == fast_dllm.mask_token_id).any()
