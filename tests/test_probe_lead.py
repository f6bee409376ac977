"""Defects found by an independent probe of the lead's latest changes, each fixed at its cause:
a non-streamed (or streamed) answer cut before a word by a stop string counted the cut word's
token in its usage (the kept text ends in the separator, which the decoded prefix without that
word lacks); serve blamed `--cache` for a scheduler its attention refuses; a uniform-noise
model as the SpecDiff drafter (`spec --draft dllm`, `bench spec --model`) failed on its step
trace ("decode with trace=False", a traceback under bench)."""

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


def test_serve_names_no_cache_option_for_a_scheduler_the_attention_refuses():
    """serve ran check_cache under a `--cache` hint; since it also refuses a scheduler whose
    look-ahead SparseD cannot carry, the error blamed `--cache / -c` for a `--scheduler` choice."""
    import socket

    from click.testing import CliRunner

    from dllm_decode.cli import main

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = CliRunner().invoke(main, ["serve", "--port", str(port), "--attention", "sparsed",
                                       "--scheduler", "credit", "-o", "base=info_gain"])
    assert result.exit_code == 2 and "'credit'" in result.output, (result.output, result.exception)
    assert "--cache" not in result.output and "Traceback" not in result.output


def test_a_noise_model_cannot_draft_for_specdiff(tmp_path):
    """The dLLM drafter reads a masked loop's step trace: a noise model is refused when the
    drafter is built (spec: one line naming --draft), and bench spec skips it as it skips a
    model of another vocabulary (was a ValueError traceback at the first round)."""
    from click.testing import CliRunner

    from dllm_decode.cli import main
    from dllm_decode.eval.bench.spec import dllm_drafter_combos

    result = CliRunner().invoke(main, ["spec", "--prompt", "sort : mia", "--draft", "dllm",
                                       "-d", "model=embedded-noise"])
    assert result.exit_code == 2 and "masked diffusion model" in result.output, (result.output, result.exception)
    said = []
    from dllm_decode.modelspec import ModelSpec, load_diffusion

    vocab = load_diffusion(ModelSpec.parse("embedded-noise")).vocab_size
    assert dllm_drafter_combos("embedded-noise", vocab, (), said.append) == []
    assert said and "uniform-noise" in said[0]
