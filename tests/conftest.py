"""Shared test set-up: deterministic CPU torch (one thread: reduction order fixed)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("PYTHONHASHSEED", "0")


@pytest.fixture(autouse=True)
def _deterministic() -> None:
    try:
        import torch
    except ImportError:  # a TensorFlow-only environment: the Keras tests still run
        return
    torch.manual_seed(0)
    torch.set_num_threads(1)
