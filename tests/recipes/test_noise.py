"""The uniform-noise recipe (`recipes/noise.py`): batches, the self-conditioned loss, a few steps
of training, and an export that the package's loader and transformers both read."""

from __future__ import annotations

import json

import pytest
import torch

from dllm_decode import load_model
from recipes import noise
from recipes.data import EOS_ID, SEP_ID, VOCAB, build_pool
from recipes.loop import LoopConfig, train

pytestmark = pytest.mark.usefixtures("one_thread")   # one torch thread (tests/recipes/conftest.py)


@pytest.fixture(scope="module")
def pool():
    return build_pool(20, seed=0)


def tiny(layers: int = 2):
    from transformers import DiffusionGemmaForBlockDiffusion

    torch.manual_seed(0)
    return DiffusionGemmaForBlockDiffusion(noise.tiny_config(hidden=32, layers=layers))


def test_batch_is_a_canvas_of_the_answer_after_its_clean_prefix(pool):
    batch = noise.canvas_batch(pool, 64, 8, step=3, seed=0)
    assert batch.clean.shape == batch.noisy.shape == (64, 8)
    assert batch.self_condition and not noise.canvas_batch(pool, 4, 8, step=4, seed=0).self_condition
    answers = {tuple(p + [SEP_ID]): a + [EOS_ID] for p, a in zip(pool.prompts, pool.answers)}
    for row in range(64):
        prefix = batch.prefix[row][batch.prefix_mask[row].bool()].tolist()
        cut = prefix.index(SEP_ID) + 1                      # the first `=` closes every prompt
        answer = answers[tuple(prefix[:cut])]
        answer += [EOS_ID] * (-len(answer) % 8)
        start = len(prefix) - cut
        assert start % 8 == 0 and prefix[cut:] == answer[:start]
        assert batch.clean[row].tolist() == answer[start:start + 8]
    changed = (batch.noisy != batch.clean).float().mean().item()
    assert 0.2 < changed < 0.8                              # t ~ U(0, 1]: about half, less collisions
    assert int(batch.noisy.max()) < len(VOCAB)
    assert ((batch.temperature >= 0.4) & (batch.temperature <= 0.8)).all()
    again = noise.canvas_batch(pool, 64, 8, step=3, seed=0)
    assert torch.equal(again.noisy, batch.noisy) and torch.equal(again.prefix, batch.prefix)


def test_self_conditioned_step_feeds_the_first_pass_back(pool):
    """The self-conditioned loss differs from the plain one on the same batch (the first pass's
    logits reach the decoder), and only the graded pass carries gradient."""
    model = tiny()
    batch = noise.canvas_batch(pool, 8, 8, step=1, seed=0)
    plain = noise.CanvasBatch(*[getattr(batch, f) for f in ("prefix", "prefix_mask", "clean", "noisy",
                                                            "temperature")], self_condition=False)
    with_sc, without = noise.canvas_loss(model, batch), noise.canvas_loss(model, plain)
    assert abs(with_sc.item() - without.item()) > 1e-6
    with_sc.backward()
    sc = model.model.decoder.self_conditioning.down_proj.weight.grad
    assert sc is not None and sc.abs().sum() > 0


def test_training_lowers_the_loss_and_the_export_loads_in_both_runtimes(pool, tmp_path):
    from transformers import DiffusionGemmaForBlockDiffusion

    model = tiny()
    losses = train(model, lambda step: noise.canvas_loss(model, noise.canvas_batch(pool, 16, 8, step, 0)),
                   LoopConfig(steps=40, lr=3e-3, warmup=5, log_every=1000), tmp_path / "run")
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5
    noise.export(model, tmp_path / "model")
    generation = json.loads((tmp_path / "model" / "generation_config.json").read_text())
    assert generation["eos_token_id"] == EOS_ID and generation["max_denoising_steps"] == 16
    ours = load_model(str(tmp_path / "model"))
    reference = DiffusionGemmaForBlockDiffusion.from_pretrained(str(tmp_path / "model")).float().eval()
    ids = torch.tensor([[4, 5, 6, SEP_ID]])
    canvas = torch.randint(0, len(VOCAB), (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = reference(input_ids=ids, decoder_input_ids=canvas).logits
    got = ours.denoise(canvas, ours.encode(ids))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
