"""Suggested code is code: the optimizer line a finding suggests keeps the script's own other
arguments (momentum, weight decay, betas), taken from the live optimizer, and compiles."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nanguard
from nanguard import Cause, NonFiniteError


def _code_lines(fixes: list[str]) -> list[str]:
    """The fixes written as Python (an assignment or a call of torch's), not advice in words."""
    return [f for f in fixes if f.startswith(("optimizer =", "scheduler =", "torch.", "y = "))]


def test_a_learning_rate_fix_keeps_momentum_and_weight_decay_and_compiles() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=5.0, momentum=0.9, weight_decay=1e-4)
    x, y = torch.randn(64, 8), torch.randn(64, 1) * 3
    with pytest.raises(NonFiniteError) as info, nanguard.attach(model, opt):
        for _ in range(50):
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
    d = info.value.diagnosis
    assert d is not None and d.cause is Cause.LEARNING_RATE_TOO_HIGH
    first = d.fixes[0]
    assert first.startswith("optimizer = torch.optim.SGD(model.parameters(), lr=")
    assert first.split("  #")[0].endswith(", momentum=0.9, weight_decay=0.0001)"), first
    for line in _code_lines(d.fixes):
        compile(line, "<fix>", "exec")


def test_an_optimizer_with_its_defaults_is_suggested_as_it_was_written() -> None:
    from nanguard.torch._port import kept_args

    m = nn.Linear(2, 2)
    assert kept_args(torch.optim.Adam(m.parameters(), lr=1e-3)) == {}
    assert kept_args(torch.optim.AdamW(m.parameters(), lr=1.0, betas=(0.9, 0.95))) == {"betas": (0.9, 0.95)}
    assert kept_args(torch.optim.RMSprop(m.parameters(), lr=0.1, eps=0.0)) == {"eps": 0.0}


def test_every_optimizer_line_of_the_phrasebooks_compiles() -> None:
    from nanguard.core.phrases import KERAS, TORCH

    kw = {"opt": "SGD", "lr": "0.001", "kept": ", momentum=0.9", "was": "  # was 0.1", "clip": "3",
          "sched": "StepLR", "peak": "0.01", "top": "0.1"}
    for book in (TORCH, KERAS):
        lr = book.lr
        lines = [lr.new_lr, lr.eps_fix, *lr.lr_fixes, *lr.explode_fixes,
                 *(lr.lr_fixes_scheduled or ()), *(lr.lr_fixes_cyclic or ()), *(lr.lr_fixes_varying or ())]
        for template in lines:
            text = template.format(**kw)
            if text.startswith(("optimizer =", "scheduler =", "torch.", "peak_lr")):
                compile(text.replace("...", "None"), "<fix>", "exec")


def test_a_keras_optimizer_line_keeps_its_own_arguments() -> None:
    keras = pytest.importorskip("keras")
    from nanguard.keras._context import kept_args

    assert kept_args(keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)) == {"momentum": 0.9}
    assert kept_args(keras.optimizers.Adam(learning_rate=0.1)) == {}
