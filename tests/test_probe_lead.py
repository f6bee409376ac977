"""Defects found by an independent probe of the lead's latest changes, each fixed at its cause:
a non-streamed (or streamed) answer cut before a word by a stop string counted the cut word's
token in its usage (the kept text ends in the separator, which the decoded prefix without that
word lacks)."""

from __future__ import annotations


def test_a_stop_cut_before_a_word_counts_only_the_returned_tokens(embedded):
    from dllm_decode.serve.app import answer_tokens

    tokenizer = embedded.tokenizer
    tokens = tuple(tokenizer.encode("alice bob ella hank kate", add_special_tokens=False))
    assert len(tokens) == 5
    assert answer_tokens(tokenizer, "alice bob ella ", tokens) == tokens[:3]     # stop "hank"
    assert answer_tokens(tokenizer, "alice bob ella hank", tokens) == tokens[:4]  # stop " kate"
    assert answer_tokens(tokenizer, "", tokens) == ()
    assert answer_tokens(tokenizer, "alice bob ella hank kate", tokens) == tokens
