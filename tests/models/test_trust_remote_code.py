"""`trust_remote_code`: a checkpoint whose tokenizer is its own Python class (as Dream-v0 ships
`DreamTokenizer`) loads only when opted in, through the API, the CLI and lm-eval's model_args,
and fails with one line naming the flag otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dllm_decode.cli import main
from dllm_decode.models import ModelLoadError, load_model
from dllm_decode.testing import tiny_llada_with_tokenizer

TOKENIZER_CODE = '''from transformers import PreTrainedTokenizerFast


class DreamTokenizer(PreTrainedTokenizerFast):
    """A stand-in for Dream-v0's tokenizer class (the directory's own code)."""

    loaded_from_directory_code = True
'''


@pytest.fixture
def custom_dir(tmp_path: Path, monkeypatch) -> Path:
    """A tiny LLaDA whose tokenizer_config maps AutoTokenizer to `tokenization_dream.DreamTokenizer`."""
    import transformers.dynamic_module_utils as dynamic

    monkeypatch.setattr(dynamic, "HF_MODULES_CACHE", str(tmp_path / "hf_modules"))  # no ~/.cache writes
    directory = tmp_path / "model"
    model = tiny_llada_with_tokenizer()
    model.save_pretrained(directory)
    model.tokenizer.save_pretrained(directory)
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.update(tokenizer_class="DreamTokenizer",
                  auto_map={"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]})
    config_path.write_text(json.dumps(config))
    (directory / "tokenization_dream.py").write_text(TOKENIZER_CODE)
    return directory


def test_custom_tokenizer_needs_the_opt_in(custom_dir):
    with pytest.raises(ModelLoadError) as info:
        load_model(custom_dir)
    message = str(info.value)
    assert "\n" not in message
    assert "--trust-remote-code" in message and "tokenization_dream.DreamTokenizer" in message
    model = load_model(custom_dir, trust_remote_code=True)
    assert type(model.tokenizer).__name__ == "DreamTokenizer"
    assert model.tokenizer.loaded_from_directory_code


def test_cli_flag_on_decode(custom_dir):
    args = ["--model", str(custom_dir), "--gen-length", "4", "--block-length", "4", "--prompt",
            "a b c", "--no-chat-template"]
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code == 2 and "--trust-remote-code" in refused.output, refused.output
    assert "Traceback" not in refused.output
    trusted = CliRunner().invoke(main, [*args, "--trust-remote-code", "--json"])
    assert trusted.exit_code == 0, trusted.output
    assert json.loads(trusted.output)["nfe"] >= 1


def test_cli_flag_on_eval(custom_dir, tmp_path):
    args = ["eval", "--model", str(custom_dir), "--tasks", "copy", "--limit", "1", "--gen-length", "4",
            "--out", str(tmp_path / "out"), "--no-plots", "--no-chat-template"]
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code == 2 and "--trust-remote-code" in refused.output, refused.output
    trusted = CliRunner().invoke(main, [*args, "--trust-remote-code"])
    assert trusted.exit_code == 0, trusted.output


def test_lm_eval_model_args(custom_dir):
    from dllm_decode.eval.harness.lm_eval_adapter import DllmDecodeLM

    with pytest.raises(ModelLoadError, match="trust-remote-code"):
        DllmDecodeLM(model=str(custom_dir), gen_length=4)
    lm = DllmDecodeLM(model=str(custom_dir), gen_length=4, trust_remote_code="True")
    assert type(lm.tokenizer).__name__ == "DreamTokenizer"
