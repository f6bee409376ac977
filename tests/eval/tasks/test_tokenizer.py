"""The word-level tokenizer: coverage of every task word, HF round trip, exact decoding."""

from __future__ import annotations

import json

import pytest

from dllm_decode.eval.tasks import LONG_LENGTHS, TASKS, WAITING_LINE
from dllm_decode.eval.tasks.tokenizer import EOS, MASK, PAD, UNK, build_tokenizer, load_tokenizer, save_tokenizer


@pytest.fixture(scope="module")
def hf_tokenizer(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tok")
    save_tokenizer(directory)
    return load_tokenizer(directory)


def test_saved_layout_and_special_tokens(tmp_path):
    save_tokenizer(tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {"tokenizer.json", "tokenizer_config.json",
                                                    "special_tokens_map.json"}
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert (config["mask_token"], config["eos_token"], config["pad_token"], config["unk_token"]) == (
        MASK, EOS, PAD, UNK)


def test_auto_tokenizer_loads_offline_with_ids(hf_tokenizer):
    ids = {hf_tokenizer.mask_token_id, hf_tokenizer.eos_token_id, hf_tokenizer.pad_token_id,
           hf_tokenizer.unk_token_id}
    assert None not in ids and len(ids) == 4
    assert hf_tokenizer.convert_ids_to_tokens(hf_tokenizer.mask_token_id) == MASK


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_word_is_one_known_token_and_decodes_back(hf_tokenizer, name):
    lengths = LONG_LENGTHS if name in WAITING_LINE else None
    for ex in TASKS[name].examples("test", 10, 0) + TASKS[name].examples("train", 10, 0, lengths=lengths):
        for text in (ex.prompt, ex.answer):
            ids = hf_tokenizer(text, add_special_tokens=False)["input_ids"]
            assert len(ids) == len(text.split())
            assert hf_tokenizer.unk_token_id not in ids
            assert hf_tokenizer.decode(ids) == text


def test_special_tokens_stay_whole_and_can_be_skipped(hf_tokenizer):
    text = f"copy : alice bob {EOS} {MASK}"
    ids = hf_tokenizer(text)["input_ids"]
    assert ids[-2:] == [hf_tokenizer.eos_token_id, hf_tokenizer.mask_token_id]
    assert hf_tokenizer.decode(ids, skip_special_tokens=True) == "copy : alice bob"


def test_unknown_words_and_punctuation():
    tok = build_tokenizer()
    encoding = tok.encode('copy : ["alice", zebra]')
    assert encoding.tokens == ["copy", ":", "[", '"', "alice", '"', ",", UNK, "]"]
    assert load_tokenizer().decode(encoding.ids) == 'copy : [ " alice " , [UNK] ]'


@pytest.mark.parametrize("name", ["ar_target", "ar_draft"])
def test_shipped_ar_tokenizers_ask_in_the_training_format(name):
    """The AR models were trained on `prompt = answer`: their chat template adds the separator,
    so `spec` and `eval --model ar:...` prompt them correctly without knowing the format."""
    from transformers import AutoTokenizer

    from dllm_decode.models.checkpoint import EMBEDDED_DIR

    tokenizer = AutoTokenizer.from_pretrained(str(EMBEDDED_DIR / name))
    text = tokenizer.apply_chat_template([{"role": "user", "content": "copy : lucy eric"}],
                                         add_generation_prompt=True, tokenize=False)
    assert text == "copy : lucy eric ="
