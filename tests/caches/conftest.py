"""Fixtures for the cache tests: the tiny LLaDA / Dream factories of the model tests."""

from __future__ import annotations

import pytest
import torch

from tests.models.conftest import FAMILIES


@pytest.fixture(params=sorted(FAMILIES))
def make_native(request):
    """Factory `(layers=2, seed=0, **config overrides) -> model`, once per native family."""
    return FAMILIES[request.param]


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models on a shared 2-core machine: one intra-op thread avoids oversubscription stalls
    (measured 10x faster under load), and the numbers do not depend on it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
