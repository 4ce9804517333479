"""With policy ``raise`` the weights are read with the gradients only when they may have moved
(``nanguard.torch._watched.weights_wanted``), and when a check fails."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nanguard
from nanguard.core.history import History, StepRecord
from nanguard.torch._watched import WEIGHTS_EVERY


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def _param_norm_steps(lr: float, steps: int = 20) -> list[int]:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    with nanguard.attach(model, opt) as g:
        for _ in range(steps):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    return [r.step for r in g.history if r.param_norm is not None]


def test_small_updates_have_the_weights_read_every_eighth_step() -> None:
    # lr 1e-6: each update moves the weights by ~1e-7 of their norm. A record gets the weights
    # the next step's check read: steps 1-3 and every 8th step read them (and detach, at the end)
    known = _param_norm_steps(1e-6)
    assert known == [0, 1, 2, WEIGHTS_EVERY - 1, 2 * WEIGHTS_EVERY - 1, 19]


def test_large_updates_have_the_weights_read_every_step() -> None:
    # lr 2: each update is several % of the weights' norm: a weights-growing warning needs each step
    assert _param_norm_steps(2.0) == list(range(20))


def test_nonfinite_weights_on_a_step_not_read_are_found_with_the_failure() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    with pytest.raises(nanguard.NonFiniteError) as info, nanguard.attach(model, opt) as g:
        for step in range(12):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            if step == 5:  # as if update 5 had written a NaN: step 6 would not read the weights
                with torch.no_grad():
                    model[2].weight[0, 0] = float("nan")
    f = info.value.finding
    assert (f.phase, f.op, f.module, f.step, f.detected_by) == ("optimizer", "SGD.step", "2", 5, "watch")
    rec5 = next(r for r in g.history if r.step == 5)
    assert rec5.param_norm is not None and not math.isfinite(rec5.param_norm)


def test_growth_per_step_counts_the_steps_between_sparse_readings() -> None:
    h = History()
    for i in range(9):
        h.append(StepRecord(step=i, loss=1.0, param_norm=10.0 * 2.0 if i == 8 else (10.0 if i == 0 else None)))
    growth = h.per_step_growth("param_norm", 9)
    assert growth is not None and abs(growth - 2.0 ** (1 / 8)) < 1e-12
