"""Fixtures the recipe tests share with the eval tests (one torch thread)."""

from tests.eval.conftest import one_thread  # noqa: F401
