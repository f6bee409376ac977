"""Greedy decodes of the block-diffusion families against their reference decoders.

Each reference decode below is written from a reading of the released generation function, for
one prompt, greedy, and runs the reference NETWORK where transformers has it (Qwen2 for
Fast-dLLM v2, Qwen3 for SDAR, both under a brute-force block-causal mask) so it shares no code
with the model under test; LLaDA2's network exists only here, so its decode runs our model with
a full forward each step. Under block-causal attention a full forward over `[0, block end)` gives
the same rows as the references' KV-cached forwards (blocks never see later blocks).

One deliberate difference is applied to the references: the [MASK] logit is excluded before the
argmax (the loop never writes [MASK]; a reference that picks it leaves the position masked).

The rules read, for one row:

* Fast-dLLM v2 `batch_sample` (use_block_cache off): a prefill over the prompt's whole blocks when
  the prompt is longer than a block; if it ends on the grid, the argmax of the prefill's last
  row is appended (the block start). Blocks `P // b .. G // b + P // b - 1`; each is extended
  with masks to its end and decoded sub-block by sub-block, left to right: forward the whole
  block, shift the fed rows right by one (`cat(l[:1], l[:-1])`), and in the sub-block commit the
  masked positions with p > threshold plus the most confident one. A committed stop token ends
  the decode after the block. A finished block gets a KV-write forward whose last row's argmax
  is appended: the next block's first token, committed before that block's first step.
* SDAR `block_diffusion_generate` (low_confidence_dynamic, steps = block, so one token per step
  at least) and LLaDA2 `generate` (steps = block): the canvas is `ceil((P + G) / b)` whole
  blocks; from block `P // b` on, each step forwards `[0, block end)` and commits the block's
  masked positions with p > threshold, or the most confident one when none clears it; a block
  holding a stop token after the prompt ends the decode; the answer is the first G tokens.
"""

from __future__ import annotations

import pytest
import torch

from dllm_decode import DecodeConfig, generate
from dllm_decode.caches import BlockCache, NoCache
from dllm_decode.models import FastDLLMModel, SDARModel
from dllm_decode.schedulers import ThresholdScheduler
from dllm_decode.testing import tiny_block_diffusion
from tests.models.test_block_diffusion import (BLOCK, EOS, FAST_DLLM_KEYS, MASK, reference_logits,
                                               released, tiny_reference)

GEN = 12                        # three blocks of 4


def network(reference):
    """raw(ids list) -> (L, V) float32 logits of the reference network under the block mask."""
    def raw(ids: list[int]) -> torch.Tensor:
        row = torch.tensor([ids])
        return reference_logits(reference, row, torch.ones_like(row))[0].float()
    return raw


def ours_full(model):
    """raw(ids list) -> (L, V) logits of our model, one full forward (no cache)."""
    def raw(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return model(torch.tensor([ids]))[0].float()
    return raw


def commit(x: list[int], lo: int, logits: torch.Tensor, threshold: float) -> list[int]:
    """The references' threshold rule on columns `lo ..` of `x`: masked positions with p >
    threshold, plus the most confident masked one. Returns the tokens committed."""
    logits = logits.clone()
    logits[:, MASK] = float("-inf")
    p, token = logits.softmax(-1).max(-1)
    masked = torch.tensor([x[lo + i] == MASK for i in range(len(token))])
    p = torch.where(masked, p, torch.tensor(float("-inf")))
    chosen = (p > threshold) & masked
    chosen[p.argmax()] = True
    for i in chosen.nonzero().flatten().tolist():
        x[lo + i] = int(token[i])
    return token[chosen].tolist()


def fast_dllm_v2_decode(raw, prompt: list[int], gen: int, block: int, sub_block: int,
                        threshold: float) -> tuple[list[int], int]:
    """Fast-dLLM v2's `batch_sample` for one row, greedy. Returns (tokens after the prompt, the
    forwards our loop also runs: denoising steps plus the block starts it commits)."""
    x, n = list(prompt), len(prompt)
    forwards = 0
    if n > block and n % block == 0:
        x.append(int(raw(x)[-1].argmax()))              # the prefill's last row: block start
        forwards += 1
    for index in range(n // block, gen // block + n // block):
        lo, hi = index * block, (index + 1) * block
        x += [MASK] * (hi - len(x))
        stopped = False
        for s in range(lo, hi, sub_block):
            while MASK in x[s:s + sub_block]:
                rows = raw(x[:hi])[lo:hi]               # the fed block over the cached prefix
                shifted = torch.cat([rows[:1], rows[:-1]])
                stopped |= EOS in commit(x, s, shifted[s - lo:s - lo + sub_block], threshold)
                forwards += 1
        if stopped:
            break
        x.append(int(raw(x[:hi])[-1].argmax()))         # KV-write forward: next block start
        forwards += hi < n + gen                        # ours fuses it into that block's step
    return x[n:], forwards


def whole_block_decode(raw, prompt: list[int], gen: int, block: int, threshold: float) -> list[int]:
    """SDAR's `block_diffusion_generate` / LLaDA2's `generate` for one row, greedy, one step per
    position at most. Returns the first `gen` tokens after the prompt."""
    n = len(prompt)
    total = -(-(n + gen) // block) * block
    x = list(prompt) + [MASK] * (total - n)
    for index in range(n // block, total // block):
        lo, hi = index * block, (index + 1) * block
        while MASK in x[lo:hi]:
            commit(x, lo, raw(x[:hi])[lo:hi], threshold)
        if EOS in x[n:hi]:
            break
    return x[n:n + gen]


def until_stop(tokens: list[int]) -> list[int]:
    return tokens[:tokens.index(EOS) + 1] if EOS in tokens else tokens


def decode(model, prompt: list[int], gen: int, block: int, threshold: float, cache) -> tuple[list[int], int]:
    config = DecodeConfig(scheduler=ThresholdScheduler(threshold), gen_length=gen,
                          block_length=block, cache=cache)
    result = generate(model, [prompt], config)
    return result.tokens[0].tolist(), int(result.nfe[0])


def prompts(length: int, seeds=(0, 1, 2)) -> list[list[int]]:
    return [torch.randint(0, EOS, (length,), generator=torch.Generator().manual_seed(s)).tolist()
            for s in seeds]


CACHES = {"none": NoCache, "block": BlockCache}


def config_cache(name: str):
    return CACHES[name]()


# ---- Fast-dLLM v2 -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fast_dllm_pair(tmp_path_factory):
    reference = tiny_reference("qwen2", seed=21)
    model = released(tmp_path_factory.mktemp("fast_dllm"), reference, **FAST_DLLM_KEYS)
    assert type(model) is FastDLLMModel and model.block_start_first
    return reference, model


@pytest.mark.parametrize("cache", sorted(CACHES))
@pytest.mark.parametrize("sub_block", [2, BLOCK])
@pytest.mark.parametrize("threshold", [0.9, 0.2])
def test_fast_dllm_v2_on_the_grid_equals_batch_sample(fast_dllm_pair, cache, sub_block, threshold):
    """Prompts ending on the grid: token-identical to the reference, and the same forwards
    (our block start comes from the forward that writes the previous block, not a new one)."""
    reference, model = fast_dllm_pair
    for prompt in prompts(2 * BLOCK):
        want, forwards = fast_dllm_v2_decode(network(reference), prompt, GEN, BLOCK, sub_block, threshold)
        got, nfe = decode(model, prompt, GEN, sub_block, threshold, config_cache(cache))
        assert until_stop(got) == until_stop(want[:GEN])
        if EOS not in want[:GEN]:
            assert nfe == forwards


@pytest.mark.parametrize("cache", sorted(CACHES))
@pytest.mark.parametrize("length", [3, 6, 2 * BLOCK + 1])
def test_fast_dllm_v2_off_the_grid_equals_batch_sample(fast_dllm_pair, cache, length):
    """A prompt ending inside a block: that block starts with prompt tokens (no block-start
    step); the reference stops at its grid boundary, a few tokens short of G, and every token it
    makes is ours."""
    reference, model = fast_dllm_pair
    for prompt in prompts(length):
        want, _ = fast_dllm_v2_decode(network(reference), prompt, GEN, BLOCK, 2, 0.9)
        got, _ = decode(model, prompt, GEN, 2, 0.9, config_cache(cache))
        shared = min(len(want), GEN)
        assert until_stop(got[:shared]) == until_stop(want[:shared])


def test_fast_dllm_v2_block_start_rule_is_what_makes_it_equal(fast_dllm_pair, monkeypatch):
    """Guard: with the block start decoded as an ordinary masked position the decodes differ."""
    reference, model = fast_dllm_pair
    monkeypatch.setattr(FastDLLMModel, "block_start_first", False)
    differs = 0
    for prompt in prompts(2 * BLOCK, seeds=range(6)):
        want, _ = fast_dllm_v2_decode(network(reference), prompt, GEN, BLOCK, BLOCK, 0.9)
        got, _ = decode(model, prompt, GEN, BLOCK, 0.9, BlockCache())
        differs += until_stop(got) != until_stop(want[:GEN])
    assert differs > 0


def test_fast_dllm_block_start_is_committed_alone_in_its_first_step(fast_dllm_pair):
    """The trace: each block's first step commits exactly its first position."""
    _, model = fast_dllm_pair
    config = DecodeConfig(scheduler=ThresholdScheduler(0.01), gen_length=GEN, block_length=BLOCK,
                          cache=BlockCache(), stop_at_eos=False)
    trace = generate(model, [prompts(2 * BLOCK)[0]], config, trace=True).trace
    firsts = [entry for entry in trace if entry["block_step"] == 0]
    assert len(firsts) == GEN // BLOCK
    for entry in firsts:
        committed = entry["commit"][0].nonzero().flatten().tolist()
        assert len(committed) == 1 and (entry["offset"] + committed[0]) % BLOCK == 0
    later = [entry["commit"][0].sum().item() for entry in trace if entry["block_step"] == 1]
    assert max(later) > 1                   # threshold 0.01: the rest of a block in one step


# ---- SDAR and LLaDA2: whole blocks on the grid -------------------------------------------------

@pytest.fixture(scope="module")
def sdar_pair(tmp_path_factory):
    reference = tiny_reference("qwen3", seed=22)
    model = released(tmp_path_factory.mktemp("sdar"), reference, model_type="sdar",
                     architectures=["SDARForCausalLM"], block_size=BLOCK, mask_token_id=MASK)
    assert type(model) is SDARModel and not model.block_start_first
    return network(reference), model


@pytest.fixture(scope="module")
def llada2_pair():
    model = tiny_block_diffusion("llada2", seed=23, block_size=BLOCK)
    return ours_full(model), model


@pytest.mark.parametrize("family", ["sdar", "llada2"])
@pytest.mark.parametrize("cache", sorted(CACHES))
@pytest.mark.parametrize("length", [2 * BLOCK, 6, 2 * BLOCK + 3])
def test_whole_block_families_equal_their_reference(request, family, cache, length):
    """On and off the grid (lengths 6 and 11 end inside a block: the last block runs past
    P + G to the grid, as the references decode it, and the answer is cut to G)."""
    raw, model = request.getfixturevalue(f"{family}_pair")
    for prompt in prompts(length):
        want = whole_block_decode(raw, prompt, GEN, BLOCK, 0.9)
        got, _ = decode(model, prompt, GEN, BLOCK, 0.9, config_cache(cache))
        assert len(got) == GEN and until_stop(got) == until_stop(want)


@pytest.mark.parametrize("cache", sorted(CACHES))
def test_a_batch_off_the_grid_equals_each_row_alone(sdar_pair, cache):
    """Rows whose grids end at different columns (each row's own tail; the shorter tails cut)."""
    raw, model = sdar_pair
    rows = [prompts(n, seeds=(n,))[0] for n in (5, 6, 8, 11)]
    config = DecodeConfig(scheduler=ThresholdScheduler(0.9), gen_length=GEN, block_length=BLOCK,
                          cache=config_cache(cache))
    batched = generate(model, rows, config).tokens
    for row, prompt in zip(batched.tolist(), rows):
        assert until_stop(row) == until_stop(whole_block_decode(raw, prompt, GEN, BLOCK, 0.9))


def test_the_last_block_is_not_cut_short(sdar_pair):
    """Guard: decoding only to P + G (the last block cut at the answer's end) changes the answer
    of an off-grid prompt on this model; the whole-block decode is what the reference does."""
    raw, model = sdar_pair
    differs = 0
    for prompt in prompts(6, seeds=range(6)):
        n = len(prompt)
        x = list(prompt) + [MASK] * GEN                  # canvas cut at P + G
        for lo in range(n // BLOCK * BLOCK, n + GEN, BLOCK):
            hi = min(lo + BLOCK, n + GEN)
            while MASK in x[lo:hi]:
                commit(x, lo, raw(x[:hi])[lo:hi], 0.9)
        got, _ = decode(model, prompt, GEN, BLOCK, 0.9, config_cache("none"))
        differs += until_stop(got) != until_stop(x[n:])
    assert differs > 0
