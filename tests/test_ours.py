"""Errors of ours are never claims about the user's run: a replay that raises is reported as
"the replay of this step failed: …" (and raised under ``NANGUARD_STRICT=1``, the suite's
switch), never as "the replay did not reproduce the non-finite value"."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nanguard
from nanguard import NonFiniteError
from nanguard.torch import replay as replay_mod


def _step_with_a_nan_gradient(guard_kw: dict[str, Any]) -> NonFiniteError:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    x[3, 1] = float("nan")
    with nanguard.attach(model, opt, **guard_kw), pytest.raises(NonFiniteError) as info:
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    return info.value


def _broken(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError("a bug in the replay")


def test_a_replay_that_raises_is_reported_as_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NANGUARD_STRICT", "0")
    monkeypatch.setattr(replay_mod, "_run_root", _broken)
    err = _step_with_a_nan_gradient({})
    note = err.finding.details.get("note", "")
    assert "the replay of this step failed: RuntimeError: a bug in the replay" in note
    assert "not in the run" in note and "did not reproduce" not in note
    assert err.finding.detected_by == "watch"  # the watch's own numbers, said as such


def test_a_replay_that_raises_is_raised_under_strict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NANGUARD_STRICT", "1")
    monkeypatch.setattr(replay_mod, "_run_root", _broken)
    with pytest.raises(RuntimeError, match="a bug in the replay"):
        _step_with_a_nan_gradient({})


def test_the_replay_still_locates_when_nothing_breaks() -> None:
    err = _step_with_a_nan_gradient({})
    assert err.finding.detected_by == "replay" and err.finding.phase == "data"
