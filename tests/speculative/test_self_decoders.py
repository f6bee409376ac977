"""The self-speculative decoders of block-diffusion models (S2D2, PSD, SimSD) on `embedded-bd`:
the registry contract, strict modes token-identical to their base decodes, batched equal to one by
one, each degenerate setting equal to the method it extends, and the verification layouts."""

from __future__ import annotations

import pytest
import torch

from dllm_decode.config import DecodeConfig
from dllm_decode.registry import component, names, registry
from dllm_decode.sampler import generate
from dllm_decode.speculative.acceptance import accept_chain
from dllm_decode.speculative.blockrun import BlockRun
from dllm_decode.speculative.self_decoder import ar_mode_generate
from dllm_decode.speculative.s2d2 import S2D2, expected_tokens, hysteresis_step
from dllm_decode.speculative.self_decoders import SELF_DECODERS, SelfDecoder

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def bd():
    from dllm_decode.models.loading import load_model

    return load_model("embedded-bd")


@pytest.fixture(scope="module")
def prompts(bd):
    from dllm_decode.eval.bench.subject import task_samples
    from dllm_decode.eval.tasks import TASKS
    from dllm_decode.prompts import chat_prompt

    # 12 tasks, prompts of unequal lengths: left padding and per-row block grids are exercised
    return [chat_prompt(bd.tokenizer, s.example.prompt) for s in task_samples(TASKS, 1, seed=3)]


def config(rule: str = "threshold", block: int = 8, **options) -> DecodeConfig:
    return DecodeConfig(scheduler=component("scheduler", {"name": rule, **options}), gen_length=32,
                        block_length=block)


def base(bd, decoder: SelfDecoder, prompts, cfg):
    if decoder.strict_base == "generate":
        return generate(bd, prompts, cfg)
    return ar_mode_generate(bd, prompts, cfg).result


# ---- the registry contract -----------------------------------------------------------------

def test_registry_names_the_three_decoders():
    assert names("self_decoder") == tuple(registry("self_decoder")) == ("s2d2", "psd", "simsd")


@pytest.mark.parametrize("name", list(SELF_DECODERS))
def test_every_decoder_builds_by_name_defaults_strict_and_refuses_what_it_cannot_replay(name, bd):
    decoder = component("self_decoder", name)
    assert isinstance(decoder, SelfDecoder) and decoder.strict          # the lossless form by default
    assert decoder.strict_base in ("generate", "ar_mode")
    with pytest.raises(ValueError, match="cache"):
        decoder.decode(bd, ["sort : a b"], DecodeConfig(scheduler=component("scheduler", "threshold"),
                                                        cache=component("cache", "block"), gen_length=8,
                                                        block_length=8))
    with pytest.raises(ValueError, match="temperature"):
        decoder.decode(bd, ["sort : a b"], DecodeConfig(scheduler=component("scheduler", "threshold"),
                                                        temperature=0.5, gen_length=8, block_length=8))
    with pytest.raises(ValueError, match="unknown"):
        component("self_decoder", {"name": name, "nonsense": "1"})


@pytest.mark.parametrize("name", ["s2d2", "simsd"])
def test_ar_mode_verifiers_refuse_a_model_without_a_block_size_1_mode(name):
    from dllm_decode.testing import tiny_block_diffusion, tiny_llada

    for model in (tiny_llada(), tiny_block_diffusion("llada2")):     # bidirectional; no verify_forward
        with pytest.raises(ValueError, match="block-diffusion model with verify_forward"):
            SELF_DECODERS[name]().decode(model, [[1, 2, 3]], config(block=4))


# ---- strict modes equal their base decodes; batched equals one by one ----------------------

@pytest.mark.parametrize("block", [8, pytest.param(4, marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", list(SELF_DECODERS))
def test_strict_mode_is_token_identical_to_its_base_decode(name, block, bd, prompts):
    decoder = SELF_DECODERS[name]()
    cfg = config(block=block)
    out = decoder.decode(bd, prompts, cfg)
    assert torch.equal(out.result.tokens, base(bd, decoder, prompts, cfg).tokens)
    assert bool((out.result.nfe >= out.verifies).all()) and int(out.verifies.sum()) > 0
    assert bool((out.result.forward_rows >= out.result.nfe).all())


def test_psd_strict_is_lossless_for_a_one_token_rule_too(bd, prompts):
    cfg = config("low_confidence", steps_per_block=8)
    out = SELF_DECODERS["psd"](draft_steps=3).decode(bd, prompts[:6], cfg)
    reference = generate(bd, prompts[:6], cfg)
    assert torch.equal(out.result.tokens, reference.tokens)
    assert int(out.result.nfe.sum()) < int(reference.nfe.sum())      # drafts were accepted


@pytest.mark.parametrize("decoder", [S2D2(), SELF_DECODERS["psd"](),
                                     pytest.param(SELF_DECODERS["psd"](acceptance="lenient"), marks=pytest.mark.slow),
                                     pytest.param(SELF_DECODERS["simsd"](), marks=pytest.mark.slow),
                                     SELF_DECODERS["simsd"](mode="published")],
                         ids=["s2d2", "psd", "psd-lenient", "simsd", "simsd-published"])
def test_batched_equals_one_by_one(decoder, bd, prompts):
    cfg = config()
    batch = decoder.decode(bd, prompts[:4], cfg)
    for row, prompt in enumerate(prompts[:4]):
        alone = decoder.decode(bd, [prompt], cfg)
        assert torch.equal(alone.result.tokens[0], batch.result.tokens[row]), row
        assert int(alone.result.nfe[0]) == int(batch.result.nfe[row]), row


# ---- degenerate settings reduce to the method each extends ---------------------------------

def test_s2d2_that_never_verifies_is_its_base_rule(bd, prompts):
    cfg = config()
    never = S2D2(mode="published", policy="mask_span_length", min_span=9).decode(bd, prompts, cfg)
    reference = generate(bd, prompts, cfg)
    assert torch.equal(never.result.tokens, reference.tokens)
    assert torch.equal(never.result.nfe, reference.nfe) and int(never.verifies.sum()) == 0


def test_psd_with_one_draft_step_is_the_stepwise_decoder(bd, prompts):
    cfg = config()
    one = SELF_DECODERS["psd"](draft_steps=1).decode(bd, prompts, cfg)
    reference = generate(bd, prompts, cfg)
    assert torch.equal(one.result.tokens, reference.tokens)
    assert torch.equal(one.result.nfe, reference.nfe)


def test_simsd_published_on_one_column_blocks_is_the_ar_mode_decode(bd, prompts):
    # one drafted column per round: the step-causal layout is the causal one
    cfg = config(block=1)
    out = SELF_DECODERS["simsd"](mode="published").decode(bd, prompts[:4], cfg)
    assert torch.equal(out.result.tokens, ar_mode_generate(bd, prompts[:4], cfg).result.tokens)


# ---- the layouts and the acceptance rules ---------------------------------------------------

def test_ar_mode_mask_is_causal_in_the_active_block_only(bd, monkeypatch):
    run = BlockRun.open(bd, [[5, 6, 7], [5, 6, 7, 8, 9]], config())
    masks = []
    monkeypatch.setattr(type(bd), "verify_forward",
                        lambda self, ids, mask, positions, rows: masks.append(mask) or torch.zeros(1))
    run.ar_logits(torch.arange(2), run.x)
    # row 1 (no padding): prompt of 5, block [0, 8) active: columns 0..7 causal, later blocks as
    # the model has them, the grid tail past the row's canvas never attended
    width = run.x.shape[1]
    expected = torch.zeros(width, width, dtype=torch.bool)
    for q in range(width):
        for k in range(width):
            expected[q, k] = (k <= q) if (q // 8 == k // 8 == 0) else (k // 8 <= q // 8)
    expected &= run.attention[1].bool()[None, :]
    assert torch.equal(masks[0][1, 0], expected)


@pytest.mark.parametrize("block", [8, 4])
def test_step_causal_layout_with_increasing_steps_is_the_ar_mode_forward(bd, prompts, block):
    # SimSD's query copies under a left-to-right order compute the autoregressive rows again
    run = BlockRun.open(bd, prompts[:4], config(block=block))
    rows = torch.arange(4)
    run.start = run.end.clone()                      # the second block of each row is active
    run.end = run.block_end(run.start)
    x = run.x.clone()
    filled = torch.randint(0, bd.mask_token_id, x.shape, generator=torch.Generator().manual_seed(0))
    x = torch.where(x == bd.mask_token_id, filled, x)
    order = run.columns().expand(4, -1).clone()
    plain = run.ar_logits(rows, x)
    copies = run.ar_logits(rows, x, order)
    active = run.in_block(rows)[:, run.gen_start:]
    torch.testing.assert_close(copies[active], plain[active], atol=1e-4, rtol=1e-4)


def test_expected_tokens_and_hysteresis_follow_the_reference():
    alpha = torch.tensor([[1.0, 1.0, 0.0, 1.0]])
    assert float(expected_tokens(alpha, torch.ones_like(alpha, dtype=torch.bool))[0]) == 2.0
    span = torch.tensor([[False, True, True, False]])
    assert float(expected_tokens(torch.tensor([[0.0, 0.5, 0.5, 1.0]]), span)[0]) == 0.75
    was = torch.tensor([False, False, True, True, True])
    score = torch.tensor([1.0, 1.5, -5.0, -5.5, 0.0])
    assert hysteresis_step(was, score, on=1.0, off=-5.0).tolist() == [False, True, True, False, True]


def test_ratio_acceptance_accepts_a_draft_the_verifier_agrees_with_and_resamples_the_residual():
    p = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.9, 0.1, 0.0, 0.0]])
    draft = torch.tensor([0, 0])
    q_logits = torch.log(torch.tensor([[0.5, 0.5, 1e-9, 0.9], [1e-9, 1e-9, 1.0, 0.9]]))   # id 3: [MASK]
    generator = torch.Generator().manual_seed(0)
    tokens, n = accept_chain(draft, p, q_logits, mask_id=3, greedy=False, generator=generator)
    assert n == 1 and tokens.tolist() == [0, 2]                 # q(0) ~ 0 at column 2: residual is token 2
    tokens, n = accept_chain(draft, p, q_logits, mask_id=3, greedy=True, generator=None)
    assert n == 1 and tokens.tolist() == [0, 2]                 # greedy: the argmax replaces the miss


# ---- honest counters -------------------------------------------------------------------------

def test_every_forward_is_counted_verifications_included(bd, prompts):
    cfg = config()
    prompt = prompts[:1]
    opened = BlockRun.open(bd, prompt, cfg)
    width, gen = opened.x.shape[1], opened.x.shape[1] - opened.gen_start
    psd = SELF_DECODERS["psd"](draft_steps=4).decode(bd, prompt, cfg)
    nfe, verifies = int(psd.result.nfe[0]), int(psd.verifies[0])
    assert nfe - verifies in (0, 1)                   # every forward but the first verifies
    assert verifies <= int(psd.result.forward_rows[0]) - (nfe - verifies) <= 4 * verifies   # 1..K drafts each
    simsd = SELF_DECODERS["simsd"](mode="published").decode(bd, prompt, cfg)
    nfe, verifies = int(simsd.result.nfe[0]), int(simsd.verifies[0])
    # drafts feed the canvas; a verification feeds it plus one query copy per generated column
    assert int(simsd.tokens_fed[0]) == nfe * width + verifies * gen
    assert int(simsd.result.forward_rows[0]) == nfe
    s2d2 = S2D2().decode(bd, prompt, cfg)
    assert 0 < int(s2d2.verifies[0]) < int(s2d2.result.nfe[0])   # each verification follows a draft


# ---- the AR mode on both layouts, against a one-query-at-a-time reference --------------------

def _one_query_ar_decode(model, prompt: list[int], gen: int) -> list[int]:
    """Greedy block-size-1 decode, one hand-built forward per token: the finished blocks under the
    model's own block-causal pattern, the active block causal, and the token at i predicted by
    row i - 1 (token-shifted) or by a [MASK] at i's position attending only what lies before i."""
    from dllm_decode.models.layers import block_causal_mask

    size, shift, mask_id = model.block_size, model.token_shift, model.mask_token_id
    x = list(prompt)
    while len(x) < len(prompt) + gen:
        i = len(x)
        fed = x + ([] if shift else [mask_id])
        positions = torch.arange(len(fed))[None]
        allowed = block_causal_mask(positions, (0, len(fed)), size, None)[0, 0]
        same = (positions[0][:, None] // size == i // size) & (positions[0][None, :] // size == i // size)
        later = torch.arange(len(fed))[None, :] > torch.arange(len(fed))[:, None]
        allowed = allowed & ~(same & later)
        logits = model.verify_forward(torch.tensor([fed]), allowed[None, None], positions, (0, len(fed)))
        row = logits[0, i - shift].clone()
        row[mask_id] = -float("inf")
        x.append(int(row.argmax()))
    return x[len(prompt):]


@pytest.mark.parametrize("family", ["fast_dllm", "sdar"])
def test_ar_mode_and_strict_decoders_match_a_one_query_reference(family):
    from dllm_decode.testing import tiny_block_diffusion

    torch.manual_seed(0)
    model = tiny_block_diffusion(family).eval()
    prompts = [[1, 2, 3, 4, 5], [6, 7, 8]]
    cfg = DecodeConfig(scheduler=component("scheduler", "threshold"), gen_length=12, block_length=4,
                       stop_at_eos=False)
    ar = ar_mode_generate(model, prompts, cfg).result.tokens
    for row, prompt in enumerate(prompts):
        assert ar[row].tolist() == _one_query_ar_decode(model, prompt, 12), row
    for name in ("s2d2", "simsd"):
        assert torch.equal(SELF_DECODERS[name]().decode(model, prompts, cfg).result.tokens, ar), name


def test_without_resampling_only_the_accepted_prefix_is_committed(bd, prompts):
    p = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.9, 0.1, 0.0, 0.0]])
    q_logits = torch.log(torch.tensor([[0.5, 0.5, 1e-9, 0.9], [1e-9, 1e-9, 1.0, 0.9]]))
    tokens, n = accept_chain(torch.tensor([0, 0]), p, q_logits, mask_id=3, greedy=False,
                             generator=torch.Generator().manual_seed(0), resample=False)
    assert n == 1 and tokens.tolist() == [0]
    # a first rejection with nothing accepted falls back to the base rule: the decode still ends
    out = S2D2(mode="published", policy="always", resample=False).decode(bd, prompts[:3], config())
    assert not bool((out.result.tokens == bd.mask_token_id).any())
