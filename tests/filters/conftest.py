"""Filter fixtures."""

from __future__ import annotations

import pytest

from dllm_decode.filters.mlp import save_mlp
from tests.filters.helpers import step_mlp


@pytest.fixture
def step_weights(tmp_path):
    """Factory: path of a saved `step_mlp` of the given width."""
    def make(width: int = 8) -> str:
        path = tmp_path / f"step{width}.safetensors"
        save_mlp(step_mlp(width), path)
        return str(path)
    return make
