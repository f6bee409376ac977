"""Fixtures for the cache tests: the tiny LLaDA / Dream factories of the model tests."""

from __future__ import annotations

import pytest

from tests.models.conftest import FAMILIES


@pytest.fixture(params=sorted(FAMILIES))
def make_native(request):
    """Factory `(layers=2, seed=0, **config overrides) -> model`, once per native family."""
    return FAMILIES[request.param]

