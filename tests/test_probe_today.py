"""Bad input to today's entry points found by an independent probe, each fixed at its cause:
a nested `text_config` whose sizes were never checked (DiffusionGemma)."""

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
