"""Word-level tokenizer for the task suite, saved in the Hugging Face layout.

One token per word: every name, symbol, index and instruction word the tasks produce, plus a few
punctuation marks of ParallelBench's list format. Decoding joins tokens with single spaces, so a
decoded answer compares equal to `Example.answer`.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from dllm_decode.eval.tasks.vocab import INSTRUCTIONS, NAMES, NUMBERS, SYMBOLS

PAD, UNK, EOS, MASK = "[PAD]", "[UNK]", "<|endoftext|>", "<|mdm_mask|>"
SPECIAL_TOKENS = (PAD, UNK, EOS, MASK)
SEPARATOR = "="
"""Separates prompt from answer in the AR training format (the diffusion canvas needs none)."""
PUNCTUATION = ("[", "]", ",", '"', ";", SEPARATOR)
AR_CHAT_TEMPLATE = ("{% for message in messages %}{{ message['content'] }}{% endfor %}"
                    "{% if add_generation_prompt %} " + SEPARATOR + "{% endif %}")
"""The AR models' prompt format as a chat template, so every front end (`spec`, `eval
--model ar:...`) that applies the tokenizer's template asks them the way they were trained."""


def vocabulary() -> dict[str, int]:
    """Token -> id, specials first (pad 0, unk 1, eos 2, mask 3), then words in a fixed order."""
    words = [*SPECIAL_TOKENS, *INSTRUCTIONS, *PUNCTUATION, *NUMBERS, *SYMBOLS, *NAMES]
    return {word: i for i, word in enumerate(dict.fromkeys(words))}


def build_tokenizer() -> Tokenizer:
    """The `tokenizers` object: WordLevel over `vocabulary()`, split on whitespace/punctuation."""
    tok = Tokenizer(models.WordLevel(vocabulary(), unk_token=UNK))
    # Each punctuation mark is its own token, so `["alice",` reads as `[ " alice " ,`.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation("isolated")])
    tok.decoder = decoders.WordPiece(prefix="\x00", cleanup=False)   # joins tokens with spaces
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


def save_tokenizer(directory: str | Path, chat_template: str | None = None) -> Path:
    """Write `tokenizer.json`, `tokenizer_config.json` and `special_tokens_map.json`.

    `transformers.AutoTokenizer.from_pretrained(directory)` then loads it offline, with
    `mask_token_id`, `eos_token_id`, `pad_token_id` and `unk_token_id` set (and
    `chat_template` when given: the AR models get `AR_CHAT_TEMPLATE`).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    build_tokenizer().save(str(directory / "tokenizer.json"))
    special = {"pad_token": PAD, "unk_token": UNK, "eos_token": EOS, "mask_token": MASK}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "clean_up_tokenization_spaces": False,   # keep " , " and " : " exactly as the tasks write them
        "model_max_length": 4096,
        "padding_side": "left",
        **({"chat_template": chat_template} if chat_template else {}),
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (directory / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    return directory


def load_tokenizer(directory: str | Path | None = None):
    """A `PreTrainedTokenizerFast` from `directory`, or built in memory when None."""
    from transformers import PreTrainedTokenizerFast

    if directory is not None:
        from transformers import AutoTokenizer
        return AutoTokenizer.from_pretrained(str(directory))
    return PreTrainedTokenizerFast(tokenizer_object=build_tokenizer(), pad_token=PAD,
                                   unk_token=UNK, eos_token=EOS, mask_token=MASK,
                                   clean_up_tokenization_spaces=False, padding_side="left")
