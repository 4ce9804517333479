"""Shared test set-up: deterministic CPU torch (one thread: reduction order fixed)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("PYTHONHASHSEED", "0")


@pytest.fixture(autouse=True)
def _deterministic() -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    torch.set_num_threads(1)
