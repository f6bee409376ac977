"""Bad input to today's entry points found by an independent probe, each fixed at its cause:
a nested `text_config` whose sizes were never checked (DiffusionGemma); inline `NAME:key=value`
options that could not carry a value holding commas (`es`'s proportions, list fields) and that
silently took the last of a repeated key or a `name` key that swapped the component; a prefix
cache budget accepted for a model that keeps no K/V (it stored nothing; `--kv-cache-dtype` and
`--cache prefix` already refused such a model); `bench serving` loading its model outside the
options check (a noise model, a missing folder: tracebacks) and `--prefix-tokens` past the
model's context (StopIteration), and its shared-prefix workload run on `--model`'s `embedded`
default (not the block-diffusion model it needs: a traceback from the block cache); a request
whose rule's extra forwards SparseD refuses, checked up front on `--prompt` but only at run time
for an `--input` line (exit 1) and a server request (a 500 and a traceback in the log)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from dllm_decode.cli import main

NOISE = Path(__file__).resolve().parents[1] / "dllm_decode" / "embedded" / "noise"


def _noise_copy(tmp_path: Path, **text_fields) -> Path:
    folder = tmp_path / "noise"
    shutil.copytree(NOISE, folder)
    config = json.loads((folder / "config.json").read_text())
    config["text_config"].update(text_fields)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("field,value", [("hidden_size", -4), ("num_attention_heads", 0),
                                         ("vocab_size", 2.5), ("head_dim", -2),
                                         ("num_hidden_layers", 10 ** 6)])
def test_a_bad_size_in_a_nested_text_config_is_one_line_on_load_decode_and_verify(tmp_path, field, value):
    """check_config read only the top level; a DiffusionGemma config keeps its sizes under
    `text_config`, so a negative size reached torch (a RuntimeError traceback, exit 1)."""
    from dllm_decode.models.checkpoint import ModelLoadError
    from dllm_decode.models.loading import load_model

    folder = _noise_copy(tmp_path, **{field: value})
    with pytest.raises(ModelLoadError, match=field):
        load_model(folder)
    for args in (["--model", str(folder), "--prompt", "a"], ["verify", "--model", str(folder)]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, (args, result.output, result.exception)
        assert field in result.output and "Traceback" not in result.output


def _run(*args):
    return CliRunner().invoke(main, ["--prompt", "a", "--gen-length", "8", "--block-length", "8", "--json", *args])


@pytest.mark.parametrize("args,kind,want", [
    (["--cache", "es:proportions=1@0,0.5@0.5,alpha=0.3"], "cache", {"proportions": "1@0,0.5@0.5", "alpha": 0.3}),
    (["--cache", "es:alpha=0.3,proportions=1@0,0.25@0.5"], "cache", {"proportions": "1@0,0.25@0.5", "alpha": 0.3}),
    (["--scheduler", "adaptive_block:delimiter_ids=5,6"], "scheduler", {"delimiter_ids": [5, 6]}),
])
def test_an_inline_value_holding_commas_is_one_value(args, kind, want):
    """`NAME:k=v,...` split every comma, so `es`'s documented proportions and every list field
    could be set only with -c/-o ("option '0.5@0.5' must be key=value")."""
    result = _run(*args)
    assert result.exit_code == 0, result.output
    got = json.loads(result.output.strip().splitlines()[-1])["config"][kind]
    assert {k: got[k] for k in want} == want


@pytest.mark.parametrize("args,message", [
    (["--scheduler", "threshold:threshold=0.5,threshold=0.6"], "given twice"),
    (["--attention", "sparsed:select=0.5,select=0.6"], "given twice"),
    (["--cache", "es:alpha=0.1,alpha=0.2"], "given twice"),
    (["--model", "ideal:noise=0.1,noise=0.2"], "given twice"),
    (["--scheduler", "threshold:name=random"], "'name'"),
    (["--attention", "sparsed:name=dense"], "'name'"),
    (["--filter", "eotp:name=learned"], "'name'"),
    (["--self-decoder", "s2d2:name=psd", "--model", "embedded-bd"], "'name'"),
    (["--scheduler", "threshold:0.5"], "key=value"),
])
def test_a_repeated_or_name_key_inline_is_refused_not_silently_taken(args, message):
    """The last of a repeated key won, and `name=` replaced the component named before the
    colon (`threshold:name=random` decoded with `random`)."""
    result = _run(*args)
    assert result.exit_code == 2, (result.output, result.exception)
    assert message in result.output and "Traceback" not in result.output


def test_a_prefix_cache_for_a_model_without_kv_is_refused_by_the_engine():
    """`serve --model embedded-noise --prefix-cache-bytes N` started and cached nothing; now its
    causal encoder's prompt K/V are cached (`tests/test_encoder_prefix.py`), and a model that
    keeps no K/V at all is still refused."""
    from dllm_decode.engine import Engine
    from dllm_decode.models.loading import load_model
    from dllm_decode.prefix_options import PrefixOptions

    with pytest.raises(ValueError, match="supports_kv"):
        PrefixOptions(1 << 20, keeps_kv=False)
    noise = load_model(NOISE)
    assert Engine(noise, prefix_cache_bytes=1 << 20).prefix is not None
    Engine(noise)                                   # no budget: serves as before


@pytest.mark.parametrize("args,flag", [
    (["--workload", "shared-prefix", "--prefix-tokens", "100000"], "--prefix-tokens"),
    (["--workload", "shared-prefix", "--model", "embedded"], "--model"),
])
def test_bench_serving_refuses_in_one_line_before_any_work(args, flag):
    """`bench cache` refused a noise model at its options; `bench serving` loaded it in the run
    (a ValueError traceback), and a system prompt longer than its task samples ran them out."""
    result = CliRunner().invoke(main, ["bench", "serving", "--quick", *args])
    assert result.exit_code == 2, (result.output, result.exception)
    assert flag in result.output and "Traceback" not in result.output


def test_bench_serving_shared_prefix_defaults_to_the_block_diffusion_model(monkeypatch):
    import dllm_decode.eval.bench.shared_prefix as shared
    from dllm_decode.eval.bench.protocol import OptionError

    def stop(options, say):                         # stop before any work, naming the model
        raise OptionError(None, f"would run on {options.model}")

    monkeypatch.setattr(shared, "run", stop)
    result = CliRunner().invoke(main, ["bench", "serving", "--workload", "shared-prefix", "--quick"])
    assert "would run on embedded-bd" in result.output, (result.output, result.exception)


def test_a_rule_sparsed_refuses_is_a_usage_error_for_input_lines_and_server_requests(tmp_path):
    pytest.importorskip("fastapi")
    from dllm_decode.models.loading import load_model
    from dllm_decode.serve.app import background
    from tests.serve.conftest import default_config, make_state, post

    lines = tmp_path / "in.jsonl"
    lines.write_text(json.dumps({"id": "a", "prompt": "a", "dllm": {"scheduler": "info_gain"}}) + "\n")
    result = CliRunner().invoke(main, ["--attention", "sparsed", "--gen-length", "8", "--block-length", "8",
                                       "--input", str(lines), "--output", str(tmp_path / "out.jsonl")])
    assert result.exit_code == 2 and "info_gain" in result.output, (result.output, result.exception)
    model = load_model(NOISE.parent / "dllm", attention="sparsed")
    with background(make_state(model, config=default_config(gen_length=8, block_length=8))) as url:
        status, body = post(url, "/v1/completions", {"prompt": "a", "max_tokens": 8,
                                                     "dllm": {"scheduler": "info_gain"}})
    assert status == 400 and "info_gain" in body["error"]["message"], (status, body)
