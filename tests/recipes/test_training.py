"""Training recipes on tiny configs: data pipeline, loss goes down, resume is exact, export loads."""

from __future__ import annotations

import pytest
import torch

from dllm_decode import load_model
from dllm_decode.eval.theory.ideal import IdealModel
from dllm_decode.eval.tasks import TASKS, WAITING_LINE, split_of
from dllm_decode.eval.tasks.vocab import NAMES, SYMBOLS
from dllm_decode.eval.tasks.waiting_line import ListTask
from recipes import ar, dllm
from dllm_decode.eval.tasks.puzzles import is_latin
from recipes.data import (EOS_ID, MASK_ID, PAD_ID, SEP_ID, SYMBOL_LIST_TASKS, VOCAB,
                                build_pool, causal_batch, diffusion_batch, encode, step_rng)
from recipes.evaluate import accuracy_by_task, decode_text, diffusion_generate
from recipes.loop import LoopConfig, train


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pool():
    return build_pool(40, seed=0)


def test_canonical_latin_targets_are_valid_rotations_and_leave_other_tasks_alone(pool):
    canonical = build_pool(40, seed=0, latin_target="canonical")
    words = {i: w for w, i in VOCAB.items()}
    latin = 0
    for prompt, answer, shuffled in zip(canonical.prompts, canonical.answers, pool.answers):
        text = [words[i] for i in prompt]
        if text[0] != "latin":
            assert answer == shuffled
            continue
        latin += 1
        symbols, cells = text[2:], [words[i] for i in answer]
        assert is_latin(cells, symbols) and is_latin([words[i] for i in shuffled], symbols)
        assert [cells[r * 4:(r + 1) * 4] for r in range(4)] == [symbols[r:] + symbols[:r] for r in range(4)]
    assert latin == 40
    with pytest.raises(ValueError, match="latin_target must be one of"):
        build_pool(1, latin_target="sorted")


def _list_op(words: list[str]) -> str:
    """The Waiting Line op that writes a prompt's head (`insert X at 2 :` -> insert_index)."""
    head = words[:words.index(":")]
    if head[0] in ("insert", "remove", "replace"):
        return head[0] + ("_index" if "at" in head else "_random")
    return head[0]


def test_symbol_lists_take_the_requested_share_stay_in_train_and_use_only_task_words():
    words = {i: w for w, i in VOCAB.items()}
    mixed = build_pool(40, seed=0, symbol_share=0.25, latin_weight=2.5)
    specials = {PAD_ID, EOS_ID, MASK_ID, VOCAB["[UNK]"], SEP_ID}
    counts: dict[tuple[str, str], int] = {}
    long_symbol_lists = 0
    for prompt, answer in zip(mixed.prompts, mixed.answers):
        assert not (set(prompt) | set(answer)) & specials            # only task words, all in vocab
        text = [words[i] for i in prompt]
        if text[0] in ("latin", "sudoku"):
            counts[text[0], ""] = counts.get((text[0], ""), 0) + 1
            continue
        op, items = _list_op(text), text[text.index(":") + 1:]
        kind = "symbols" if set(items) <= set(SYMBOLS) else "names"
        assert kind == "symbols" or set(items) <= set(NAMES)
        assert set(words[i] for i in answer) <= set(items) | set(text)       # moves prompt tokens
        assert split_of(op, " ".join(text)) == "train"
        counts[op, kind] = counts.get((op, kind), 0) + 1
        long_symbol_lists += kind == "symbols" and len(items) >= 8
    for op in WAITING_LINE:
        share = 10 if op in SYMBOL_LIST_TASKS else 0                 # round(40 * 0.25)
        assert counts.get((op, "symbols"), 0) == share and counts[op, "names"] == 40 - share
    assert "sort" not in SYMBOL_LIST_TASKS and long_symbol_lists == 9 * int(10 * 0.25)
    assert counts["latin", ""] == 100 and counts["sudoku", ""] == 40
    # disjoint from a symbol-list test split too, not only from the name lists the suite tests
    train = {" ".join(words[i] for i in p) for p in mixed.prompts}
    for op in SYMBOL_LIST_TASKS:
        assert not train & {e.prompt for e in ListTask(op, SYMBOLS).examples("test", 200, 0)}
    with pytest.raises(ValueError, match="symbol_share"):
        build_pool(1, symbol_share=1.5)


def test_default_mix_is_unchanged_by_the_new_options(pool):
    same = build_pool(40, seed=0, symbol_share=0.0, latin_weight=1.0)
    assert same == pool and len(pool) == 40 * len(TASKS)
    assert build_pool(40, seed=0, latin_weight=0.0).prompts == [
        p for p in pool.prompts if p[0] != VOCAB["latin"]]


def test_diffusion_batch_masks_only_the_answer_canvas(pool):
    rng, gen = step_rng(0, 3)
    batch = diffusion_batch(pool, 16, None, rng, gen)
    # the canvas starts where every row's prompt has ended: prompts are left-padded to one width
    widths = [len(p) for p in pool.prompts]
    assert batch.masked.any()
    assert not (batch.masked & (batch.attention_mask == 0)).any()          # padding never masked
    assert not (batch.masked & (batch.targets == PAD_ID)).any()
    first_masked_col = batch.masked.float().argmax(1)[batch.masked.any(1)]
    assert (first_masked_col >= min(widths)).all()
    assert torch.equal(batch.input_ids[batch.masked], torch.full_like(batch.input_ids[batch.masked], MASK_ID))
    assert torch.equal(batch.input_ids[~batch.masked], batch.targets[~batch.masked])
    assert (batch.weight[~batch.masked] == 0).all() and (batch.weight[batch.masked] > 0).all()
    assert (batch.targets[:, -1] == EOS_ID).all()                           # EOS tail is a target


def test_semi_ar_rows_are_masked_as_block_decoding_sees_them(pool):
    """Every row: clean columns, then one block at rate t, then masked to the canvas end."""
    rng, gen = step_rng(0, 7)
    batch = diffusion_batch(pool, 32, 300, rng, gen, semi_ar_share=1.0)
    canvas = batch.targets.shape[1] - 300
    masked = batch.masked[:, canvas:]
    assert masked[:, -1].all()                                    # the far tail is always masked
    for row in masked:
        last_clean = torch.nonzero(~row).max().item() if (~row).any() else -1
        first_masked = torch.nonzero(row).min().item()
        start = first_masked - first_masked % 8                   # blocks start on multiples of 8
        assert not row[:start].any()                              # before the block: clean
        assert row[start + 64:].all() and last_clean < start + 64  # after it (<= 64 long): masked
    tail_weight = batch.weight[:, -1]
    assert torch.allclose(tail_weight, torch.full_like(tail_weight, 1 / 300))   # tail counts as t = 1


def test_semi_ar_share_zero_is_plain_llada_masking(pool):
    rng, gen = step_rng(2, 5)
    plain = diffusion_batch(pool, 16, 120, rng, gen)
    masked = plain.masked[:, -120:]
    assert (~masked[:, -1]).any()           # uniform masking leaves some tail tokens visible


def test_diffusion_batch_never_masks_a_prompt_token(pool):
    for step in range(5):
        rng, gen = step_rng(1, step)
        batch = diffusion_batch(pool, 8, 40 if step % 2 else None, rng, gen)
        canvas = batch.targets.shape[1] - batch.masked.shape[1]      # 0: same width
        assert canvas == 0
        # rebuild each row's prompt span from the pool order the batch used
        rng, _ = step_rng(1, step)
        idx = [rng.randrange(len(pool)) for _ in range(8)]
        width = max(len(pool.prompts[i]) for i in idx)
        assert not batch.masked[:, :width].any()
        for row, i in enumerate(idx):
            assert batch.targets[row, width - len(pool.prompts[i]):width].tolist() == pool.prompts[i]


def test_causal_batch_supervises_answer_and_eos_only(pool):
    rng, _ = step_rng(0, 0)
    batch = causal_batch(pool, 6, rng)
    for ids, labels, mask in zip(batch.input_ids.tolist(), batch.labels.tolist(),
                                 batch.attention_mask.tolist()):
        sep = ids.index(SEP_ID)
        assert all(lab == -100 for lab in labels[:sep + 1])
        eos = ids.index(EOS_ID, sep)
        assert labels[sep + 1:eos + 1] == ids[sep + 1:eos + 1]
        assert all(lab == -100 for lab in labels[eos + 1:]) and sum(mask) == eos + 1


def _overfit(model, loss_at, tmp_path, steps=30):
    losses = train(model, loss_at, LoopConfig(steps=steps, lr=3e-3, warmup=2, log_every=1000),
                   tmp_path, log=open("/dev/null", "w"))
    return sum(losses[:3]) / 3, sum(losses[-3:]) / 3


def test_dllm_loss_goes_down_on_a_tiny_config(pool, tmp_path):
    torch.manual_seed(0)
    model = dllm.LLaDAModelLM(dllm.model_config("tiny"))
    first, last = _overfit(model, lambda step: dllm.diffusion_loss(model, pool, 0, 0, 16, 0), tmp_path)
    assert last < 0.7 * first


def test_ar_loss_goes_down_on_a_tiny_config(pool, tmp_path):
    torch.manual_seed(0)
    model = ar.LlamaForCausalLM(ar.model_config("tiny"))
    first, last = _overfit(model, lambda step: ar.causal_loss(model, pool, 0, 0, 16), tmp_path)
    assert last < 0.7 * first


def test_distilled_pool_holds_the_teachers_greedy_answers(pool, tmp_path, capsys):
    from recipes.evaluate import causal_generate

    torch.manual_seed(0)
    teacher = ar.LlamaForCausalLM(ar.model_config("tiny")).eval()
    small = type(pool)(pool.prompts[:40], pool.answers[:40])
    taught = ar.distilled(small, teacher, chunk=16)
    assert taught.prompts == small.prompts
    for prompt, answer in zip(small.prompts[:5], taught.answers):
        (out,) = causal_generate(teacher, [prompt])
        assert answer == (out[:out.index(EOS_ID)] if EOS_ID in out else out)
    assert "differ from the references" in capsys.readouterr().out


def test_init_starts_from_saved_weights_of_the_same_shape(tmp_path):
    torch.manual_seed(0)
    ar.export(ar.LlamaForCausalLM(ar.model_config("tiny")), tmp_path / "tiny")
    model = ar.initial_model("tiny", str(tmp_path / "tiny"))
    saved = ar.LlamaForCausalLM.from_pretrained(tmp_path / "tiny", dtype=torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), saved.state_dict().values()))
    with pytest.raises(SystemExit, match="differs from --size draft"):
        ar.initial_model("draft", str(tmp_path / "tiny"))


def test_dllm_init_starts_from_saved_weights_of_the_same_shape(tmp_path):
    torch.manual_seed(0)
    dllm.export(dllm.LLaDAModelLM(dllm.model_config("tiny")), tmp_path / "tiny")
    model = dllm.initial_model("tiny", str(tmp_path / "tiny"))
    saved = load_model(tmp_path / "tiny")
    ids = torch.tensor([encode("copy : A 7 K Q") + [MASK_ID] * 5])
    assert torch.allclose(model(ids), saved(ids), atol=1e-5)
    with pytest.raises(SystemExit, match="differs from --size embedded"):
        dllm.initial_model("embedded", str(tmp_path / "tiny"))


class _Interrupt(Exception):
    pass


def test_resume_from_checkpoint_reproduces_the_uninterrupted_run(pool, tmp_path):
    cfg = LoopConfig(steps=6, lr=3e-3, warmup=2, checkpoint_minutes=0.0, log_every=1000)
    devnull = open("/dev/null", "w")

    def fresh():
        torch.manual_seed(0)
        return dllm.LLaDAModelLM(dllm.model_config("tiny"))

    straight = fresh()
    train(straight, lambda s: dllm.diffusion_loss(straight, pool, s, 0, 8, 3), cfg, tmp_path / "a", log=devnull)

    broken = fresh()

    def stop_at_4(step):
        if step == 4:
            raise _Interrupt
        return dllm.diffusion_loss(broken, pool, step, 0, 8, 3)

    with pytest.raises(_Interrupt):
        train(broken, stop_at_4, cfg, tmp_path / "b", log=devnull)
    resumed = fresh()
    losses = train(resumed, lambda s: dllm.diffusion_loss(resumed, pool, s, 0, 8, 3), cfg,
                   tmp_path / "b", resume=True, log=devnull)
    assert len(losses) == 6
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


def test_exports_load_through_the_public_loaders(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = dllm.LLaDAModelLM(dllm.model_config("tiny")).eval()
    dllm.export(model, tmp_path / "dllm")
    loaded = load_model(tmp_path / "dllm")
    ids = torch.tensor([encode("copy : alice bob") + [MASK_ID] * 3])
    model.to(torch.bfloat16).float()                   # the export rounds weights to bfloat16
    assert torch.allclose(loaded(ids), model(ids), atol=1e-5)
    assert AutoTokenizer.from_pretrained(tmp_path / "dllm").mask_token_id == MASK_ID

    causal = ar.LlamaForCausalLM(ar.model_config("tiny")).eval()
    ar.export(causal, tmp_path / "ar")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "ar")
    assert again.config.num_hidden_layers == causal.config.num_hidden_layers
    assert AutoTokenizer.from_pretrained(tmp_path / "ar").eos_token_id == EOS_ID


def test_own_decoder_with_the_ideal_model_solves_deterministic_tasks():
    model = IdealModel(12)
    examples = TASKS["reverse"].examples("test", 6, 0)
    outputs, nfe = diffusion_generate(model, [encode(e.prompt) for e in examples], 12)
    assert nfe == 12                                        # one token per step
    assert [decode_text(o) for o in outputs] == [e.answer for e in examples]
    _, fewer = diffusion_generate(model, [encode(e.prompt) for e in examples], 12, threshold=0.9)
    assert fewer == 1                                       # every marginal is certain


def test_accuracy_by_task_reports_percentages():
    model = IdealModel(8)
    acc = accuracy_by_task(lambda p: diffusion_generate(model, p, 8)[0], 2)
    assert acc["copy"] == acc["sort"] == acc["replace_index"] == 100.0
    assert acc["latin_square"] == 0.0 and set(acc) == set(TASKS) | {"mean"}   # 16 cells > canvas
