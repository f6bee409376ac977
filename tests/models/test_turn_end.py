"""Chat end-of-turn tokens (LLaDA `<|eot_id|>`, Dream `<|im_end|>`) end an answer like EOS."""

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from dllm_decode.models import load_model
from dllm_decode.testing import tiny_llada


def test_loader_adds_the_tokenizers_turn_end_id_to_the_eos_ids(tmp_path):
    model = tiny_llada()                                   # EOS 35, MASK 36
    vocab = {"[UNK]": 0, "<|eot_id|>": 7, "<|endoftext|>": 35, "<|mdm_mask|>": 36}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]",
                                        eos_token="<|endoftext|>", mask_token="<|mdm_mask|>")
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    assert load_model(tmp_path).eos_token_ids == (35, 7)


def test_without_a_turn_end_token_the_eos_ids_stay(tmp_path):
    tiny_llada().save_pretrained(tmp_path)
    assert load_model(tmp_path).eos_token_ids == (35,)
