"""dParallel recipe: complementary per-row masking, the certainty-forcing loss, teacher data."""

from __future__ import annotations

import random

import pytest
import torch

from dllm_decode.eval.tasks import TASKS
from dllm_decode.eval.theory.ideal import IdealModel
from recipes import dllm
from recipes.data import EOS_ID, MASK_ID, PAD_ID, Pool, build_pool, step_rng
from recipes.dparallel import (CertaintyBatch, CertaintyConfig, certainty_batch,
                                                 certainty_loss, complementary_views, teacher_pool)
from recipes.evaluate import decode_text


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pool():
    return build_pool(10, seed=0)


CFG = CertaintyConfig(block_length=8)


@pytest.mark.parametrize("seed", range(12))
def test_views_are_complementary_with_a_clean_prefix_and_a_masked_suffix_in_every_row(seed):
    prompt_width, canvas = 5, 40
    lengths = [3, 20, 37, 12, 0]                      # blocks drawn up to index 0, 2, 4, 1, 0
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    views = complementary_views(prompt_width, canvas, lengths, CFG, rng, gen)
    col = torch.arange(prompt_width + canvas) - prompt_width
    for row, n in enumerate(lengths):                  # checked row by row: the reference's batch bug
        block = views.block[row]
        start, end = int(col[block].min()), int(col[block].max()) + 1
        assert start % CFG.block_length == 0 and start <= n and end - start == CFG.block_length
        first, second = views.first[row], views.second[row]
        assert not (first & second & block).any()                  # disjoint in the block
        assert torch.equal((first | second) & block, block)        # and they cover it
        assert not first[col < start].any() and not second[col < start].any()   # prompt + earlier blocks clean
        assert first[col >= end].all() and second[col >= end].all()             # suffix all [MASK]


def test_some_row_lands_past_the_first_block_and_the_mask_ratio_is_one_half():
    lengths = [30] * 64
    views = complementary_views(4, 40, lengths, CFG, random.Random(0), torch.Generator().manual_seed(0))
    starts = (views.block.int().argmax(-1) - 4).tolist()
    assert len(set(starts)) == 4                                   # blocks 0..3 all drawn
    share = (views.first & views.block).sum() / views.block.sum()
    assert 0.45 < float(share) < 0.55


def test_certainty_batch_masks_only_what_the_views_say_and_pads_with_eos(pool):
    rng, gen = step_rng(0, 3)
    batch = certainty_batch(pool, 6, 48, CFG, rng, gen)
    assert batch.input_ids.shape == batch.targets.shape == (12, batch.targets.shape[1])
    masked = batch.input_ids == MASK_ID
    assert torch.equal(batch.input_ids[~masked], batch.targets[~masked])
    assert not (batch.targets == MASK_ID).any()
    assert (batch.targets[:, -1] == EOS_ID).all()                   # every answer is shorter than 48
    assert not (batch.loss_mask & (batch.attention_mask == 0)).any()
    assert not (batch.loss_mask & (batch.targets == PAD_ID)).any()
    first, second = batch.loss_mask[:6], batch.loss_mask[6:]
    assert not (first & second).any() and torch.equal(batch.targets[:6], batch.targets[6:])
    # the loss positions of the two views together are exactly one block per row
    assert ((first | second).sum(-1) == CFG.block_length).all()


def _one_position(logits: list[float], target: int) -> tuple[torch.Tensor, CertaintyBatch]:
    """A batch of one row, one loss position per view, with the same logits in both views."""
    x = torch.tensor([[logits], [logits]])
    targets = torch.full((2, 1), target)
    ones = torch.ones(2, 1, dtype=torch.bool)
    return x, CertaintyBatch(targets, targets, ones.long(), ones)


def test_entropy_term_counts_only_where_the_prediction_is_already_right():
    logits = [2.0, 1.0, 0.0]
    cfg = CertaintyConfig(entropy_weight=2.0, temperature=0.5)
    x, wrong = _one_position(logits, target=1)
    loss, parts = certainty_loss(x, wrong, cfg)
    ce = -torch.log_softmax(torch.tensor(logits), -1)[1]
    assert torch.isclose(loss, 2 * ce) and parts["entropy"] == 0.0 and parts["correct"] == 0.0
    x, right = _one_position(logits, target=0)
    loss, parts = certainty_loss(x, right, cfg)
    p = torch.softmax(torch.tensor(logits) / 0.5, -1)
    h = -(p * p.log()).sum()
    ce = -torch.log_softmax(torch.tensor(logits), -1)[0]
    assert torch.isclose(loss, 2 * ce + 2 * 2.0 * h) and parts["correct"] == 1.0


def test_the_entropy_gradient_sharpens_a_correct_prediction():
    x, right = _one_position([2.0, 1.0, 0.0], target=0)
    x = x.clone().requires_grad_(True)
    loss, _ = certainty_loss(x, right, CertaintyConfig(entropy_weight=100.0))
    loss.backward()
    assert x.grad[0, 0, 0] < 0 and (x.grad[0, 0, 1:] > 0).all()   # descent raises the right logit


def test_loss_is_finite_and_decreases_on_a_toy_batch(pool):
    torch.manual_seed(0)
    model = dllm.LLaDAModelLM(dllm.model_config("tiny"))
    rng, gen = step_rng(0, 0)
    batch = certainty_batch(pool, 8, 24, CFG, rng, gen)
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss, _ = certainty_loss(model(batch.input_ids, attention_mask=batch.attention_mask), batch, CFG)
        assert torch.isfinite(loss)
        optim.zero_grad()
        loss.backward()
        optim.step()
        losses.append(loss.item())
    assert sum(losses[-3:]) / 3 < 0.7 * sum(losses[:3]) / 3


def test_teacher_pool_keeps_only_correct_answers():
    model = IdealModel(8)
    short = TASKS["reverse"].examples("train", 3, 0, lengths=(3, 6))
    long = TASKS["copy"].examples("train", 2, 0, lengths=(9, 12))     # longer than the 8 canvas
    kept, share = teacher_pool(model, short + long, gen_length=8, block_length=4, batch_size=4)
    assert share == {"reverse": 100.0, "copy": 0.0}
    assert [decode_text(a) for a in kept.answers] == [e.answer for e in short]
    assert isinstance(kept, Pool) and len(kept) == 3


def test_bad_loss_constants_are_refused():
    for bad in (dict(mask_ratio=1.0), dict(block_length=0), dict(temperature=0.0), dict(eps=1.0)):
        with pytest.raises(ValueError):
            CertaintyConfig(**bad)


def test_the_shipped_distilled_model_needs_fewer_forwards():
    """`embedded-dparallel` decodes the suite's test prompts (one per task, gen 256) under the
    entropy rule in fewer forwards than the model it was distilled from, as accurately."""
    from dllm_decode import DecodeConfig, generate, load_model
    from dllm_decode.eval.tasks import TASKS
    from dllm_decode.schedulers import EntropyThresholdScheduler

    examples = [e for name in sorted(TASKS) for e in TASKS[name].examples("test", 1, 0)]
    config = DecodeConfig(scheduler=EntropyThresholdScheduler(), gen_length=256, block_length=32)
    runs = {}
    for name in ("embedded", "embedded-dparallel"):
        result = generate(load_model(name), [e.prompt for e in examples], config)
        score = sum(TASKS[e.task].score(e, text) for e, text in zip(examples, result.text))
        runs[name] = (int(result.nfe.sum()), score)
    assert runs["embedded-dparallel"][0] < runs["embedded"][0]
    assert runs["embedded-dparallel"][1] >= runs["embedded"][1] - 1
