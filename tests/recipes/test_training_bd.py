"""The block-diffusion recipe (`recipes/bd.py`): conversion, batches, the two-stream training
mask, the loss, the recipe's own decoder, export (spec `block-diffusion.md` §5.9 acceptance tests)."""

from __future__ import annotations

import json

import pytest
import torch

from dllm_decode import load_model
from recipes import ar, bd
from recipes.data import EOS_ID, MASK_ID, PAD_ID, SEP_ID, build_pool, encode
from recipes.evaluate import causal_generate
from recipes.loop import LoopConfig, train
from dllm_decode.models import FastDLLMModel
from dllm_decode.models.checkpoint import EMBEDDED_DIR, load_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")   # one torch thread (tests/recipes/conftest.py)


@pytest.fixture(scope="module")
def pool():
    return build_pool(20, seed=0)


@pytest.fixture(scope="module")
def tiny_ar(tmp_path_factory):
    """A seeded tiny Llama saved in the AR recipe's layout (the shape of `embedded/ar_target`)."""
    torch.manual_seed(0)
    model = ar.LlamaForCausalLM(ar.model_config("tiny")).eval()
    directory = tmp_path_factory.mktemp("tiny_ar")
    model.save_pretrained(directory)
    return model, directory


PROMPTS = [encode("sort : carol alice bob"), encode("copy : ian"), encode("remove at 2 : sam mia ruby")]


def test_shipped_ar_target_has_the_mask_token():
    tokenizer = load_tokenizer(EMBEDDED_DIR / "ar_target")
    assert tokenizer.mask_token_id == MASK_ID and tokenizer.eos_token_id == EOS_ID


def test_conversion_with_block_1_is_the_ar_model(tiny_ar):
    """Spec §5.9d: block-causal with b = 1 is causal, so the converted logits are the AR ones,
    un-shifted (row i <- AR row i - 1)."""
    model, directory = tiny_ar
    converted = bd.converted(directory, block_size=1)
    assert isinstance(converted, FastDLLMModel) and converted.config.attention_bias is False
    ids = torch.tensor([PROMPTS[0] + [SEP_ID] + encode("alice bob carol")])
    with torch.no_grad():
        torch.testing.assert_close(converted(ids)[:, 1:], model(ids).logits[:, :-1], atol=1e-5, rtol=0)


def test_block_generate_with_block_1_is_greedy_ar(tiny_ar):
    """Spec §5.9f: with the unconverted weights and b = 1 the block decoder is greedy AR."""
    model, directory = tiny_ar
    converted = bd.converted(directory, block_size=1)
    got = bd.block_generate(converted, PROMPTS, gen_length=10)
    expected = causal_generate(model, PROMPTS, max_new_tokens=10)
    for g, e in zip(got, expected):
        end = g.index(EOS_ID) + 1 if EOS_ID in g else len(g)
        assert g[:end] == e[:end]


def test_rows_are_block_aligned_and_the_copies_are_complementary(pool):
    batch = bd.block_batch(pool, 8, 4, step=3, seed=0)
    assert batch.clean.shape == (16, batch.clean.shape[1]) and batch.clean.shape[1] % 4 == 0
    first, second = batch.masked[:8], batch.masked[8:]
    assert not (first & second).any()                               # disjoint
    for row, (clean, real) in enumerate(zip(batch.clean[:8].tolist(), batch.real[:8].tolist())):
        sep, length = clean.index(SEP_ID), sum(real)
        answer = torch.zeros(len(clean), dtype=torch.bool)
        answer[sep + 1:length] = True
        assert torch.equal(first[row] | second[row], answer)       # together: exactly the answer
        assert length % 4 == 0 and clean[length - 1] == EOS_ID     # EOS-filled to the block end
        assert all(t == PAD_ID for t in clean[length:])
    assert torch.equal(batch.noisy[batch.masked], torch.full_like(batch.noisy[batch.masked], MASK_ID))
    assert torch.equal(batch.noisy[~batch.masked], batch.clean[~batch.masked])


def test_training_mask_by_brute_force():
    """Spec §5.9b: an x_t row sees its own block's x_t and earlier blocks' x_0, never its own
    clean copy or a later block; x_0 rows are block-causal over x_0; padding never attended."""
    n, block = 10, 4
    real = torch.ones(1, n, dtype=torch.bool)
    real[0, -2:] = False
    mask = bd.training_mask(real, block)[0, 0]
    for q in range(2 * n):
        for k in range(2 * n):
            qb, kb = (q % n) // block, (k % n) // block
            if not real[0, k % n]:
                expected = False
            elif q < n:
                expected = (k < n and kb == qb) or (k >= n and kb < qb)
            else:
                expected = k >= n and kb <= qb
            assert bool(mask[q, k]) == expected, (q, k)


def test_clean_stream_is_the_inference_forward(tiny_ar, pool):
    """The x_0 half of the training forward equals the model's own block-causal forward on the
    clean rows: the states a decoder sees once earlier blocks are final."""
    _, directory = tiny_ar
    model = bd.converted(directory, block_size=4)
    batch = bd.block_batch(pool, 4, 4, step=0, seed=1)
    with torch.no_grad():
        _, clean_h = bd.two_stream_hidden(model, batch)
        inference = model(batch.clean, attention_mask=batch.real.long())     # un-shifted rows
    real = batch.real[:, 1:]
    torch.testing.assert_close(model.head(clean_h[:, :-1])[real], inference[:, 1:][real], atol=1e-5, rtol=0)


@pytest.mark.parametrize("boundary", bd.BOUNDARY_RULES)
def test_loss_goes_down_on_a_tiny_model(tiny_ar, pool, tmp_path, boundary):
    _, directory = tiny_ar
    model = bd.converted(directory, block_size=4)
    batch = bd.block_batch(pool, 8, 4, step=0, seed=0)
    losses = train(model, lambda step: bd.bd_loss(model, batch, boundary),
                   LoopConfig(steps=25, lr=3e-3, warmup=2, log_every=1000), tmp_path,
                   log=open("/dev/null", "w"))
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3


def test_boundary_rule_changes_only_block_start_targets(tiny_ar, pool):
    _, directory = tiny_ar
    model = bd.converted(directory, block_size=4)
    batch = bd.block_batch(pool, 4, 4, step=2, seed=0)
    width = batch.clean.shape[1]
    inner = batch.masked & (torch.arange(width) % 4 != 0)             # no block-start target
    inner_batch = bd.BlockBatch(batch.clean, torch.where(inner, MASK_ID, batch.clean), batch.real, inner)
    with torch.no_grad():
        assert bd.bd_loss(model, inner_batch, "clean") == bd.bd_loss(model, inner_batch, "noisy")
        assert bd.bd_loss(model, batch, "clean") != bd.bd_loss(model, batch, "noisy")


def test_export_loads_through_load_model(tiny_ar, tmp_path):
    _, directory = tiny_ar
    model = bd.converted(directory, block_size=4)
    bd.export(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "fast_dllm_llama" and config["bd_size"] == 4
    assert config["mask_token_id"] == MASK_ID and config["attention_bias"] is False
    loaded = load_model(tmp_path)
    assert isinstance(loaded, FastDLLMModel) and loaded.block_size == 4
    assert loaded.mask_token_id == MASK_ID and loaded.tokenizer.mask_token_id == MASK_ID
    assert loaded.tokenizer.apply_chat_template([{"role": "user", "content": "copy : ian"}],
                                                tokenize=False, add_generation_prompt=True) == "copy : ian ="
    ids = torch.tensor([PROMPTS[0] + [SEP_ID]])
    with torch.no_grad():      # bfloat16 on disk: close to the float32 model, not equal
        assert (loaded(ids) - model(ids)).abs().amax() < 0.05 * model(ids).abs().amax()


@pytest.mark.slow
def test_recipe_trains_exports_and_the_export_loads(tiny_ar, tmp_path, capsys):
    _, directory = tiny_ar
    out = tmp_path / "run"
    args = ["--out", str(out), "--init", str(directory), "--steps", "3", "--batch-size", "4",
            "--pool-per-task", "5", "--eval-n", "1", "--block-size", "4"]
    bd.main(args)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["block_size"] == 4 and summary["steps_done"] == 3
    assert set(summary["accuracy"]) == {"k1", "t0.9", "t0.7"}
    assert summary["accuracy"]["k1"]["tokens_per_forward"] > 0
    assert load_model(out / "model").block_size == 4
    bd.main(args + ["--export-only"])
    assert "exported" in capsys.readouterr().out
