"""Fixtures the eval tests share."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def one_thread():
    """Tiny models gain nothing from a second thread and, on a loaded machine, OpenMP's barrier
    waits for a descheduled worker at every op (measured: 30x slower steps)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
