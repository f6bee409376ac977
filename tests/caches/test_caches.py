"""The caches inside the loop: exactness where the maths says exact, batching, every scheduler,
rows dropped mid-run, attention masks that change between steps, errors and the CLI."""

from __future__ import annotations

import dataclasses
import json
from typing import ClassVar

import pytest
import torch
from click.testing import CliRunner

from dllm_decode.caches import CACHES, BlockKVCache, DualCache, NoCache, PrefixCache
from dllm_decode import DecodeConfig, generate
from dllm_decode.config import accepts_cache
from dllm_decode.cli import main
from dllm_decode.interfaces import Decision, Filter, Scheduler, StepInput
from dllm_decode.registry import build
from dllm_decode.testing import (OracleMaskPredictor, assert_probabilities_close, probabilities_differ,
                                 tiny_llada)
from tests.caches.helpers import assert_same_decode
from dllm_decode.schedulers import MASK_SCHEDULERS, SCHEDULERS, ThresholdScheduler

VOCAB, MASK, EOS = 37, 36, 35
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10]]       # left padding: three prompt lengths
KV_CACHES = sorted(name for name, cls in CACHES.items() if issubclass(cls, BlockKVCache))


def _accepts_bidirectional(name: str) -> bool:
    """Caches that serve bidirectional models (the block cache refuses them; it has its own tests
    on block-diffusion models in test_block_cache.py)."""
    try:
        CACHES[name]().init_state(tiny_llada())
    except ValueError:
        return False
    return True


BIDIRECTIONAL = sorted(name for name in CACHES if _accepts_bidirectional(name))


def _skip_unless_accepted(name: str, model) -> None:
    """The layer-wise caches (d2, elastic) run the LLaDA layout only: they refuse Dream and
    wrapped models (their own tests cover batching and dropped rows on real models)."""
    try:
        CACHES[name]().init_state(model)
    except ValueError as err:
        pytest.skip(str(err))


def config(scheduler=None, gen=16, block=8, **kw) -> DecodeConfig:
    return DecodeConfig(scheduler=scheduler or ThresholdScheduler(), gen_length=gen,
                        block_length=block, **kw)


def decode(model, cache, prompts=PROMPTS, cfg=None, filters=(), **kw):
    cfg = dataclasses.replace(cfg or config(), cache=cache, filters=tuple(filters))
    return generate(model, prompts, cfg, trace=True, **kw)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("name", KV_CACHES)
def test_refresh_every_step_equals_no_cache(name, temperature, make_native):
    model, cfg = make_native(layers=3, seed=3), config(temperature=temperature)
    runs = [decode(model, cache, cfg=cfg, generator=torch.Generator().manual_seed(7))
            for cache in (build(CACHES, name, {"refresh_every": "1"}), NoCache())]
    assert_same_decode(*runs)


@pytest.mark.parametrize("name", KV_CACHES)
def test_one_layer_block_start_refresh_is_exact(name, make_native):
    """One layer: a position's K/V depend only on its own token, so nothing cached goes stale."""
    model = make_native(layers=1, seed=4)
    assert_same_decode(decode(model, CACHES[name]()), decode(model, NoCache()))


@pytest.mark.parametrize("name", KV_CACHES)
def test_multi_layer_refresh_steps_are_exact_and_cached_steps_are_not(name):
    model = tiny_llada(seed=3, layers=3)
    cfg = config(stop_at_eos=False)
    cached, reference = decode(model, CACHES[name](), cfg=cfg), decode(model, NoCache(), cfg=cfg)
    first = cached.trace[0]
    assert first["block_step"] == 0
    assert_probabilities_close(first["confidence"], reference.trace[0]["confidence"])
    assert len(cached.trace) > 2                   # there were cached steps to compare
    steps = min(len(cached.trace), len(reference.trace))
    differs = [probabilities_differ(c["confidence"], r["confidence"])
               for c, r in zip(cached.trace[1:steps], reference.trace[1:steps]) if c["block_step"] > 0]
    assert any(differs)                             # stale K/V really are used (approximate)


@pytest.mark.parametrize("name", BIDIRECTIONAL)
def test_batched_equals_one_by_one(name, make_native):
    model = make_native(seed=3)
    _skip_unless_accepted(name, model)
    cache = CACHES[name]()
    batched = generate(model, PROMPTS, dataclasses.replace(config(), cache=cache))
    for row, prompt in enumerate(PROMPTS):
        alone = generate(model, [prompt], dataclasses.replace(config(), cache=cache))
        assert torch.equal(batched.tokens[row], alone.tokens[0])
        assert batched.nfe[row] == alone.nfe[0]


@pytest.mark.parametrize("cache_name", BIDIRECTIONAL)
@pytest.mark.parametrize("scheduler_name", sorted(MASK_SCHEDULERS))
def test_every_scheduler_with_every_cache_leaves_no_mask(scheduler_name, cache_name):
    scheduler = SCHEDULERS[scheduler_name]()
    block = 5 if scheduler.chooses_block_bounds else 8      # adaptive bounds need not divide
    cfg = config(scheduler, gen=16, block=block, stop_at_eos=False)
    if not accepts_cache(scheduler, cache_name):       # e.g. backtracking needs no cache
        with pytest.raises(ValueError, match="use cache 'none'"):
            dataclasses.replace(cfg, cache=CACHES[cache_name]())
        return
    result = generate(tiny_llada(seed=5), PROMPTS, dataclasses.replace(cfg, cache=CACHES[cache_name]()), generator=torch.Generator().manual_seed(0))
    assert not (result.tokens == MASK).any()
    post = scheduler.post_steps + 1 if scheduler.revises != "none" else 0    # edit passes after a fill
    ahead = 16 if scheduler.lookahead_candidates else 0     # a look-ahead call per step at most
    assert (result.nfe >= 1).all() and (result.nfe <= 16 + 2 * post + ahead).all()  # >= 1 commit per step with work


@dataclasses.dataclass(frozen=True)
class RaggedBlocks(Scheduler):
    """Threshold rule whose blocks end 3, 5, 7, ... columns after their start in rows 0, 1, 2, ...
    so rows run out of step: the loop passes the cache (min start, max end) over rows."""

    chooses_block_bounds: ClassVar[bool] = True

    def block_end(self, inp: StepInput, state):
        return inp.block[:, 0] + 3 + 2 * torch.arange(inp.block.shape[0]), state

    def select(self, inp: StepInput, state):
        return Decision(commit=inp.confidence >= 0.9), state


@pytest.mark.parametrize("name", KV_CACHES)
def test_per_row_block_bounds_keep_one_layer_exactness(name):
    model, cfg = tiny_llada(seed=4, layers=1), config(RaggedBlocks(), gen=16, block=5, stop_at_eos=False)
    cached, reference = decode(model, CACHES[name](), cfg=cfg), decode(model, NoCache(), cfg=cfg)
    assert not (cached.tokens == MASK).any()
    assert_same_decode(cached, reference)


class EosForPrompt(torch.nn.Module):
    """tiny_llada that predicts EOS everywhere, confidently, in rows whose first prompt token is 1."""

    supports_kv = True

    def __init__(self, layers: int = 2):
        super().__init__()
        self.inner = tiny_llada(seed=3, layers=layers)
        self.mask_token_id, self.eos_token_ids = MASK, (EOS,)
        self.vocab_size, self.max_length = VOCAB, None

    def forward(self, input_ids, attention_mask=None, positions=None, kv=None, rows=None):
        logits = self.inner(input_ids, attention_mask, positions, kv=kv, rows=rows)
        first = input_ids.gather(1, (input_ids == EOS).long().argmin(-1, keepdim=True))  # skip padding
        return logits + 100.0 * torch.nn.functional.one_hot(torch.tensor(EOS), VOCAB) * (first == 1)[..., None]


@pytest.mark.parametrize("name", BIDIRECTIONAL)
def test_rows_dropped_mid_block_keep_the_cache_consistent(name):
    """Row 0 ends its first block at step 0 (all EOS) and is dropped while the others still decode
    through the cache; they must decode exactly as they do alone."""
    model, cache, cfg = EosForPrompt(), CACHES[name](), config(gen=24, block=8)
    _skip_unless_accepted(name, model)
    batched = generate(model, PROMPTS, dataclasses.replace(cfg, cache=cache))
    assert batched.nfe[0] == 1 and (batched.nfe[1:] > 3).all()
    assert (batched.tokens[0] == EOS).all()
    for row in (1, 2):
        alone = generate(model, [PROMPTS[row]], dataclasses.replace(cfg, cache=cache))
        assert torch.equal(batched.tokens[row], alone.tokens[0])
        assert batched.nfe[row] == alone.nfe[0]


@dataclasses.dataclass(frozen=True)
class TruncateAt(Filter):
    """Truncate every row `at` columns after the generation start (EoTP-like mask change)."""

    at: int

    def __call__(self, inp: StepInput, decision: Decision) -> Decision:
        column = inp.gen_span[:, 0] + self.at
        return dataclasses.replace(decision, truncate_at=column)


@pytest.mark.parametrize("name", KV_CACHES)
def test_attention_mask_changing_mid_block_keeps_one_layer_exactness(name):
    """The truncation masks columns after the refresh; cached steps must use the new mask."""
    model, cfg = tiny_llada(seed=4, layers=1), config(gen=16, block=8, stop_at_eos=False)
    cut = [TruncateAt(at=6)]
    cached, reference = decode(model, CACHES[name](), cfg=cfg, filters=cut), decode(model, NoCache(), cfg=cfg, filters=cut)
    assert (cached.tokens[:, 6:] == EOS).all() and len(cached.trace) > 1
    assert_same_decode(cached, reference)
    assert not torch.equal(reference.tokens, decode(model, NoCache(), cfg=cfg).tokens)  # the cut matters


@pytest.mark.parametrize("name", KV_CACHES)
def test_model_without_kv_support_is_a_one_line_error(name):
    oracle = OracleMaskPredictor(torch.arange(4), torch.full((4,), 0.5), VOCAB, MASK, EOS)
    with pytest.raises(ValueError, match=r"OracleMaskPredictor .*accepted caches for this model: none\b"):
        generate(oracle, [[1]], dataclasses.replace(config(gen=4, block=4), cache=CACHES[name]()))


def test_refresh_policy_is_validated():
    with pytest.raises(ValueError, match="refresh_every must be >= 1"):
        PrefixCache(refresh_every=0)
    with pytest.raises(ValueError, match="after_look must be >= 0"):
        DualCache(after_look=-1)
    assert build(CACHES, "dual", {"refresh_every": "none"}) == DualCache()
    assert build(CACHES, "prefix", {"refresh_every": "4"}).refresh_every == 4


class Spy(torch.nn.Module):
    """Records, per forward, whether the KV cache was empty (a refresh) and the rows asked for."""

    supports_kv = True

    def __init__(self):
        super().__init__()
        self.inner = tiny_llada(seed=3)
        self.mask_token_id, self.eos_token_ids = MASK, (EOS,)
        self.vocab_size, self.max_length = VOCAB, None
        self.calls: list[tuple[bool, tuple[int, int]]] = []

    def forward(self, input_ids, attention_mask=None, positions=None, kv=None, rows=None):
        self.calls.append((kv is None or not kv.filled, rows))
        return self.inner(input_ids, attention_mask, positions, kv=kv, rows=rows)


@pytest.mark.parametrize("every", [None, 1, 3])
def test_refresh_policy_decides_which_forwards_are_full(every):
    """Refresh at every block start and every `refresh_every` steps; in-block steps feed the block."""
    model = Spy()
    cfg = config(SCHEDULERS["low_confidence"](), gen=16, block=8, stop_at_eos=False)   # 8 steps a block
    result = generate(model, [[1, 2, 3]], dataclasses.replace(cfg, cache=DualCache(refresh_every=every)))
    full = [step % 8 == 0 or (every is not None and step % 8 % every == 0) for step in range(16)]
    assert [refresh for refresh, _ in model.calls] == full
    assert [rows for _, rows in model.calls] == [
        (3 + 8 * (step // 8), 19) if full[step] else (3 + 8 * (step // 8), 11 + 8 * (step // 8))
        for step in range(16)]
    assert result.nfe.tolist() == [16]                 # refresh passes are decode steps: 1 NFE each


@pytest.mark.parametrize("name", ["prefix", "dual"])
def test_without_block_refresh_only_the_first_forward_is_full(name):
    """`block_refresh=False`: one full forward per decode; every later block (its first step
    included) feeds only its own rows (dual) or the rest of the canvas from it (prefix)."""
    model = Spy()
    cfg = config(SCHEDULERS["low_confidence"](), gen=16, block=8, stop_at_eos=False)
    cache = build(CACHES, name, {"block_refresh": "false"})
    assert cache.block_refresh is False
    result = generate(model, [[1, 2, 3]], dataclasses.replace(cfg, cache=cache))
    assert [refresh for refresh, _ in model.calls] == [True] + [False] * 15
    ends = [19 if step == 0 or name == "prefix" else 11 + 8 * (step // 8) for step in range(16)]
    assert [rows for _, rows in model.calls] == [(3 + 8 * (step // 8), end) for step, end in enumerate(ends)]
    assert not (result.tokens == MASK).any() and result.nfe.tolist() == [16]


def test_dual_vicinity_window_widens_the_fed_rows():
    model = tiny_llada(seed=3)
    wide = DualCache(prefix_look=2, after_look=3)
    assert wide.rows((10, 18), 24) == (8, 21) and wide.rows((1, 18), 20) == (0, 20)
    result = decode(model, wide)
    assert not (result.tokens == MASK).any()
    assert {step["offset"] for step in result.trace if step["block_step"] > 0} == {-2, 6}


@pytest.mark.parametrize("name", KV_CACHES)
def test_cli_decodes_with_the_cache_and_names_it(name):
    out = CliRunner().invoke(main, ["--model", "tiny", "--cache", name, "-c", "refresh_every=2",
                                    "--gen-length", "16", "--block-length", "8", "--prompt", "w1 w2",
                                    "--json"])
    assert out.exit_code == 0, out.output
    record = json.loads(out.output)
    assert record["config"]["cache"]["name"] == name and record["config"]["cache"]["refresh_every"] == 2
    assert record["nfe"] >= 2


def test_cli_rejects_a_bad_refresh_policy():
    out = CliRunner().invoke(main, ["--model", "tiny", "--cache", "dual", "-c", "refresh_every=0",
                                    "--prompt", "w1"])
    assert out.exit_code == 2 and "refresh_every must be >= 1" in out.output
