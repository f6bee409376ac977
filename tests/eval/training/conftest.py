"""The filter tests' fixtures, shared by the filter-training tests."""

from tests.filters.conftest import step_weights  # noqa: F401
