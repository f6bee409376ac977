"""The self-speculative decoders at every entry point: `dllm-decode --self-decoder` gives the Python
API's tokens, `eval --self-decoder` records them, `serve` and the masked models refuse them in one
line, the compatibility matrix has their rows, and the tuner searches them on block models."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from dllm_decode.cli import main
from dllm_decode.config import DecodeConfig
from dllm_decode.registry import component

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

PROMPT = "sort : mia ella hank"


@pytest.fixture(scope="module")
def bd():
    from dllm_decode.models.loading import load_model

    return load_model("embedded-bd")


def invoke(*args):
    return CliRunner().invoke(main, list(args))


def error_lines(result) -> list[str]:
    return [line for line in result.output.splitlines() if line.startswith("Error:")]


@pytest.mark.parametrize("given, built", [
    (["--self-decoder", "s2d2"], {"name": "s2d2"}),
    (["--self-decoder", "psd:acceptance=lenient", "-s", "draft_steps=2"],
     {"name": "psd", "acceptance": "lenient", "draft_steps": "2"}),
    (["--self-decoder", "simsd", "-s", "mode=published"], {"name": "simsd", "mode": "published"}),
])
def test_cli_decode_gives_the_python_apis_tokens(given, built, bd):
    from dllm_decode.prompts import chat_prompt

    result = invoke("--model", "embedded-bd", "--prompt", PROMPT, "--json", *given)
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    decoder = component("self_decoder", built)
    assert out["self_decoder"]["name"] == built["name"] and out["verifies"] > 0
    config = DecodeConfig.from_dict(out["config"])
    api = decoder.decode(bd, [chat_prompt(bd.tokenizer, PROMPT)], config,
                         generator=torch.Generator().manual_seed(config.seed), tokenizer=bd.tokenizer)
    assert out["tokens"] == api.result.tokens[0].tolist()
    assert out["nfe"] == int(api.result.nfe[0]) and out["text"] == api.result.text[0]


@pytest.mark.parametrize("args, words", [
    (["--model", "embedded", "--self-decoder", "s2d2"], "needs a block-diffusion model"),
    (["--model", "embedded-bd", "--self-decoder", "psd", "--cache", "block"], "cache BlockCache"),
    (["--model", "embedded-bd", "--self-decoder", "psd", "--temperature", "0.5"], "temperature 0.5"),
    (["--model", "embedded-bd", "--self-decoder", "psd", "--stream"], "drop --stream"),
    (["--model", "embedded-bd", "--self-decoder", "psd", "--compile"], "drop --compile"),
    (["--self-decoder", "psd", "-s", "draft_steps=1000"], "must be <= 64"),
    (["--self-decoder", "nope"], "unknown self_decoder 'nope'"),
    (["-s", "draft_steps=2"], "need a self-decoder"),
    (["serve", "--model", "embedded-bd", "--self-decoder", "psd"], "cannot drive a self-decoder"),
])
def test_what_a_self_decoder_cannot_run_is_refused_in_one_line(args, words):
    result = invoke(*args, *([] if args[0] == "serve" else ["--prompt", PROMPT]))
    assert result.exit_code == 2, result.output
    errors = error_lines(result)
    assert len(errors) == 1 and words in errors[0], result.output
    assert "Traceback" not in result.output


def test_eval_records_self_decoded_samples(tmp_path, bd):
    from dllm_decode.prompts import chat_prompt

    out = tmp_path / "run"
    result = invoke("eval", "--model", "embedded-bd", "--tasks", "sort", "--limit", "3", "--self-decoder", "none",
                    "--self-decoder", "psd", "-s", "draft_steps=3", "--out", str(out), "--no-plots",
                    "--no-progress", "--json")
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    loop = {r["index"]: r for r in records if "self_decoder" not in r}
    psd = {r["index"]: r for r in records if r.get("self_decoder", {}).get("name") == "psd"}
    assert len(loop) == len(psd) == 3 and all(r["self_decoder"]["draft_steps"] == 3 for r in psd.values())
    for index, row in psd.items():                # strict PSD: the loop's answers, its own forwards
        assert row["output"] == loop[index]["output"]
        config = DecodeConfig.from_dict(row["decode_config"])
        api = component("self_decoder", {"name": "psd", "draft_steps": "3"}).decode(
            bd, [chat_prompt(bd.tokenizer, row["prompt"])], config, tokenizer=bd.tokenizer)
        assert row["nfe"] == int(api.result.nfe[0]) <= loop[index]["nfe"]
    refused = invoke("eval", "--model", "embedded", "--tasks", "sort", "--limit", "1", "--self-decoder", "simsd",
                     "--out", str(tmp_path / "masked"))
    assert refused.exit_code == 2 and "needs a block-diffusion model" in refused.output
    sharded = invoke("eval", "--model", "embedded-bd", "--tasks", "sort", "--limit", "1", "--self-decoder", "psd",
                     "--tensor-parallel", "2", "--out", str(tmp_path / "tp"))
    assert sharded.exit_code == 2 and "drop --tensor-parallel" in sharded.output


def test_the_compatibility_matrix_has_the_self_decoder_rows():
    from dllm_decode.compat import FAMILIES, markdown, self_decoder_tables

    models = {name: FAMILIES[name][1]() for name in ("llada", "fast_dllm", "sdar", "diffusion_gemma")}
    tables = self_decoder_tables(models)
    family, cache = tables["self-decoder x family"], tables["self-decoder x cache"]
    for name in ("s2d2", "psd", "simsd"):
        assert family[(name, "fast_dllm")].ok and family[(name, "sdar")].ok
        assert not family[(name, "diffusion_gemma")].ok and "noise canvas" in family[(name, "diffusion_gemma")].reason
        assert cache[(name, "none")].ok and not cache[(name, "block")].ok
        assert "| `" + name + "` |" in markdown(family)
    assert not family[("s2d2", "llada")].ok and family[("psd", "llada")].ok    # PSD needs no AR mode


def test_the_tuner_searches_the_self_decoders_a_block_model_takes(tmp_path):
    from dllm_decode.eval.harness.runner import decoder_for
    from dllm_decode.eval.tune.space import self_decoders_for
    from dllm_decode.modelspec import ModelSpec

    block, _ = decoder_for(ModelSpec.parse("embedded-bd"))
    masked, _ = decoder_for(ModelSpec.parse("embedded"))
    assert self_decoders_for(block, 32, 8) == ["s2d2", "psd", "simsd"]
    assert self_decoders_for(masked, 32, 8) == []
    result = invoke("tune", "--model", "embedded-bd", "--tasks", "sort", "--calibration", "2", "--held-out", "1",
                    "--rules", "threshold", "--gen-length", "32", "--block-length", "8", "--budget", "within:50",
                    "--confidence", "0.5", "--out", str(tmp_path), "--no-progress")
    assert result.exit_code == 0, result.output
    points = json.loads((tmp_path / "tune.json").read_text())["points"]
    searched = {p["setting"].get("self_decoder", {}).get("name", "none") for p in points}
    assert searched == {"none", "s2d2", "psd", "simsd"}
    refused = invoke("tune", "--model", "embedded", "--tasks", "sort", "--calibration", "2", "--held-out", "1",
                     "--rules", "threshold", "--self-decoders", "s2d2", "--out", str(tmp_path / "m"))
    assert refused.exit_code == 2 and "needs a block-diffusion model" in refused.output


def test_a_tuned_self_decoder_preset_decodes_with_it_and_is_refused_by_serve(tmp_path):
    from dllm_decode.eval.harness.grid import Setting
    from dllm_decode.eval.harness.presets import Preset, preset_setting
    from dllm_decode.eval.tune.output import parts

    setting = Setting(scheduler="threshold", options=(("threshold", "0.8"),), gen_length=32, block_length=8,
                      self_decoder="psd")
    preset = Preset(parts(setting, 32))
    assert preset.build_self_decoder() == component("self_decoder", "psd")
    assert preset_setting(preset, gen_length=32, block_length=None).key == setting.key
    path = tmp_path / "presets.json"
    path.write_text(json.dumps({"presets": {"sort": {"parts": preset.parts}}}))
    result = invoke("--model", "embedded-bd", "--preset", f"{path}:sort", "--prompt", PROMPT, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["self_decoder"]["name"] == "psd"
    served = invoke("serve", "--model", "embedded-bd", "--preset", f"{path}:sort")
    assert served.exit_code == 2 and "cannot drive a self-decoder" in served.output
