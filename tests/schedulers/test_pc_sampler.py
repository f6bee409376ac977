"""PC-Sampler: position-decayed, frequency-calibrated ranking; its frequency tables."""

from __future__ import annotations

import json

import pytest
import torch

from dllm_decode import DecodeConfig, generate
from dllm_decode.schedulers import LowConfidenceScheduler, PCSamplerScheduler
from dllm_decode.eval.tasks.frequency_table import build_embedded_table
from dllm_decode.schedulers.frequency import (SHIPPED, TABLES_DIR, FrequencyTable, build_frequency_table,
                                              check_table, log_frequency, read_table)
from dllm_decode.testing import tiny_llada
from tests.schedulers.inputs import step_input


class WordTokenizer:
    """Ids by first appearance of whitespace-separated words (a stand-in for a real tokenizer)."""

    def __init__(self, words):
        self.vocab = {w: i for i, w in enumerate(words)}

    def encode(self, text, add_special_tokens=False):
        return [self.vocab[w] for w in text.split()]

    def get_vocab(self):
        return dict(self.vocab)


@pytest.fixture(scope="module")
def model():
    return tiny_llada(seed=2)


PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9]]


def run(model, scheduler, gen_length=16, block_length=8):
    return generate(model, PROMPTS, DecodeConfig(scheduler=scheduler, gen_length=gen_length,
                                                 block_length=block_length, stop_at_eos=False))


def test_uniform_table_without_clip_or_decay_is_low_confidence(model):
    pc = run(model, PCSamplerScheduler(table="uniform", clip=float("inf"), decay=0.0, steps_per_block=4))
    base = run(model, LowConfidenceScheduler(steps_per_block=4))
    assert torch.equal(pc.tokens, base.tokens) and torch.equal(pc.nfe, base.nfe)


def test_a_large_decay_decodes_left_to_right():
    g = torch.Generator().manual_seed(0)
    inp = step_input(torch.randn(1, 12, 9, generator=g) * 3)
    commit = PCSamplerScheduler(table="uniform", decay=50.0).select(inp, None)[0].commit[0]
    assert commit.nonzero().flatten().tolist() == [0]


def test_rare_tokens_rank_first(tmp_path):
    table = FrequencyTable(torch.tensor([0, 1]), torch.tensor([90, 10]), 100)
    path = table.save(tmp_path / "t.safetensors")
    probs = torch.tensor([[[0.9, 0.1, 0.0], [0.2, 0.8, 0.0]]])          # column 1 predicts the rare id 1
    commit = PCSamplerScheduler(table=str(path), decay=0.0).select(step_input(probs=probs), None)[0].commit[0]
    assert commit.tolist() == [False, True]                           # 0.8 ln 10 > 0.9 ln (10/9)


def test_log_space_score_keeps_far_positions_apart_where_the_product_underflows():
    probs = torch.tensor([[[0.9, 0.1, 0.0]] * 2])
    inp = step_input(probs=probs, offset=600, gen_span=[(0, 602)], block=[(600, 602)])
    score = PCSamplerScheduler(table="uniform").score(inp)
    product = torch.exp(torch.tensor(-0.25 * 600.0)) * 0.9, torch.exp(torch.tensor(-0.25 * 601.0)) * 0.9
    assert product[0] == product[1] == 0.0                            # the reference's float32 product ties
    assert score[0, 0] > score[0, 1]


def test_block_origin_equals_generation_origin_when_the_block_is_the_generation(model):
    a = run(model, PCSamplerScheduler(table="uniform", origin="block"), block_length=16)
    b = run(model, PCSamplerScheduler(table="uniform", origin="generation"), block_length=16)
    assert torch.equal(a.tokens, b.tokens)


def test_builder_counts_and_the_unseen_floor(tmp_path):
    tok = WordTokenizer(["a", "b", "c", "d"])
    table = build_frequency_table(tok, ["a a b", "a c"], source="test")
    assert table.total == int(table.counts.sum()) == 5
    log_f = table.log_frequency(4)
    assert torch.allclose(log_f.exp(), torch.tensor([3 / 5, 1 / 5, 1 / 5, 1 / 5]))   # d unseen: 1/N
    again = read_table(table.save(tmp_path / "t.safetensors"))
    assert torch.equal(again.ids, table.ids) and again.total == 5 and again.metadata["source"] == "test"


@pytest.mark.parametrize("key", ["p_baseline_dict", "token_frequency_dict"])
def test_reference_json_loads_under_both_key_spellings(tmp_path, key):
    path = tmp_path / "ref.json"
    path.write_text(json.dumps({"num_token": 10, key: {"3": 4, "7": 6}}))
    table = read_table(path)
    assert table.ids.tolist() == [3, 7] and table.counts.tolist() == [4, 6] and table.total == 10


def test_a_table_for_another_vocabulary_is_refused_in_one_line(model):
    with pytest.raises(ValueError, match="built for another vocabulary .* the model has 37") as err:
        check_table("embedded", 37)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="built for another vocabulary"):
        check_table("embedded", 126464)                   # ids fit, but it counts another tokenizer
    with pytest.raises(ValueError, match="built for another vocabulary"):
        generate(model, PROMPTS, DecodeConfig(scheduler=PCSamplerScheduler(table="embedded"), gen_length=8,
                                              block_length=8))


def test_auto_takes_the_shipped_table_for_its_vocabulary_and_warns_on_others():
    check_table("auto", 129)                              # the embedded vocabulary: no warning
    with pytest.warns(UserWarning, match="runs uncalibrated"):
        check_table("auto", 37)
    assert torch.equal(log_frequency("auto", 129, 0.0, "cpu"), log_frequency("embedded", 129, 0.0, "cpu"))


def test_the_shipped_table_is_rebuilt_byte_identically_by_its_recipe(tmp_path):
    rebuilt = build_embedded_table(tmp_path / "frequency.safetensors")
    assert rebuilt.read_bytes() == (TABLES_DIR / SHIPPED["embedded"]).read_bytes()


def test_freq_table_command_counts_local_text_for_a_models_tokenizer(tmp_path):
    from click.testing import CliRunner

    from dllm_decode.cli import main

    text = tmp_path / "t.jsonl"
    text.write_text('{"t": "copy : alice bob"}\n{"t": "alice"}\n')
    out = tmp_path / "f.safetensors"
    result = CliRunner().invoke(main, ["freq-table", "--model", "embedded", "--text", str(text), "--field", "t",
                                       "--out", str(out)])
    assert result.exit_code == 0, result.output
    table = read_table(out)
    assert table.total == 5 and table.metadata["vocab_size"] == "129"
    check_table(str(out), 129)
    bad = CliRunner().invoke(main, ["freq-table", "--model", "embedded", "--text", str(text), "--field", "x",
                                    "--out", str(out)])
    assert bad.exit_code == 2 and "with a 'x' field" in bad.output and "Traceback" not in bad.output
