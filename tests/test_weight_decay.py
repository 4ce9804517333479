"""A weight decay too strong for the learning rate is named as the root (lr × weight_decay ≥ 1
rescales the weights by 1 − lr·wd ≤ 0 every step), and its fix — a weight decay sized for this
learning rate, the rest of the optimizer kept — trains without a NaN."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nanguard
from nanguard import Cause, NonFiniteError


def _train(wd: float, steps: int = 300) -> tuple[list[float], nanguard.Guard]:
    torch.manual_seed(0)
    x = torch.randn(512, 16)
    y = x[:, :1] * 2 + 0.1 * torch.randn(512, 1)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, weight_decay=wd)
    losses = []
    with nanguard.attach(model, opt) as guard:
        for _ in range(steps):
            i = torch.randint(0, 512, (32,))
            opt.zero_grad()
            loss = F.mse_loss(model(x[i]), y[i])
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses, guard


def test_a_huge_weight_decay_is_named_with_a_fix_that_trains() -> None:
    with pytest.raises(NonFiniteError) as info:
        _train(60.0)
    d = info.value.diagnosis
    assert d is not None and d.cause is Cause.LEARNING_RATE_TOO_HIGH
    assert d.summary == "the weight decay is too strong for the learning rate: lr × weight_decay = 3"
    assert any(line.startswith("weight_decay=60 with learning rate 0.05: lr × weight_decay = 3, so each step "
                               "multiplies the weights by 1 − 3 = -2") for line in d.evidence)
    assert d.fixes[0].startswith("opt = torch.optim.SGD(model.parameters(), lr=0.05, weight_decay=0.002)"
                                 "  # was weight_decay=60; verified on the failing step: loss "), d.fixes
    losses, guard = _train(0.002)  # the first fix, applied as a user would
    assert not guard.findings and all(math.isfinite(v) for v in losses)
    assert sum(losses[-20:]) / 20 < 0.1 * sum(losses[:20]) / 20  # and it learns
