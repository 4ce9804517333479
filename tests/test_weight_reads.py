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
from nanguard.torch._watched import WEIGHTS_EVERY, ReadCadence


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


def test_small_updates_have_the_weights_read_every_eighth_step(monkeypatch: pytest.MonkeyPatch) -> None:
    # lr 1e-6: each update moves the weights by ~1e-7 of their norm. A record gets the weights
    # the next step's check read: steps 1-3 and every 8th step read them (and detach, at the end)
    # — with reads free of cost (an unbounded budget), the cadence stays at its shortest
    monkeypatch.setattr(ReadCadence, "BUDGET", float("inf"))
    known = _param_norm_steps(1e-6)
    assert known == [0, 1, 2, WEIGHTS_EVERY - 1, 2 * WEIGHTS_EVERY - 1, 19]


def test_costly_reads_space_the_weights_reads_out_to_64_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    # reads that cost more than any budget: after the first 8 checks are timed, every 64th step
    monkeypatch.setattr(ReadCadence, "BUDGET", 0.0)
    known = _param_norm_steps(1e-6, steps=140)
    assert known == [0, 1, 2, WEIGHTS_EVERY - 1, 63, 127, 139]


def _cadence(step_s: float, check_s: float, n: int = 16) -> int:
    c = ReadCadence()
    for _ in range(n):
        c.timed(check_s, False, lambda: step_s)
    return c.every


def test_the_cadence_is_what_two_reads_cost_against_a_quarter_percent_of_a_step() -> None:
    # 2 reads every k steps <= 0.25 % of k steps: k >= 2 * check / (0.0025 * step), in powers of 2
    assert _cadence(0.100, 0.0001) == 8     # a large compute-bound step: norms are 0.1 % of it
    assert _cadence(0.010, 0.0003) == 32    # 2*0.3 ms / 25 us = 24 -> 32
    assert _cadence(0.001, 0.00006) == 64   # the small MLP: norms 6 % of a step, capped at 64
    assert _cadence(0.001, 0.00006, n=7) == WEIGHTS_EVERY  # not yet timed enough: the shortest
    c = ReadCadence()
    for _ in range(16):  # checks that read the weights too do not count as a read's cost
        c.timed(0.0005, True, lambda: 0.001)
    assert c.every == WEIGHTS_EVERY


def test_large_updates_have_the_weights_read_every_step() -> None:
    # lr 2: each update is several % of the weights' norm: a weights-growing warning needs each step
    assert _param_norm_steps(2.0) == list(range(20))


def test_nonfinite_weights_on_a_step_not_read_are_found_with_the_failure() -> None:
    """An update (here a step post-hook, inside ``opt.step()``) writes a NaN on a step whose
    weights are not read: found at the next check, blamed on that update. (A write by the script
    between the steps, in its own code, is named as the script's: ``tests/test_collectives.py``.)"""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))

    def update_5_writes_a_nan(o: torch.optim.Optimizer, *_: object) -> None:
        if len(g.history) == 5:  # update 5: step 6 would not read the weights
            with torch.no_grad():
                model[2].weight[0, 0] = float("nan")

    opt.register_step_post_hook(update_5_writes_a_nan)
    with pytest.raises(nanguard.NonFiniteError) as info, nanguard.attach(model, opt) as g:
        for _ in range(12):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
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
