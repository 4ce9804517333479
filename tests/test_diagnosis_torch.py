"""Diagnoses of real PyTorch runs whose evidence the rules once misread."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nanguard
from _rule_cases import contradictions
from nanguard import Cause, NonFiniteError


class _Net(nn.Module):
    """fc0 → a weight-normalized fc1 → fc2; channel 3 of fc1's direction ``v`` zeroed (pruned)."""

    def __init__(self, old_api: bool) -> None:
        super().__init__()
        self.fc0 = nn.Linear(8, 16)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the old API is deprecated
            if old_api:
                self.fc1 = nn.utils.weight_norm(nn.Linear(16, 16))
            else:
                self.fc1 = nn.utils.parametrizations.weight_norm(nn.Linear(16, 16))
        self.fc2 = nn.Linear(16, 1)
        with torch.no_grad():
            v = self.fc1.weight_v if old_api else self.fc1.parametrizations.weight.original1
            v[3].zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(torch.relu(self.fc0(x)))))


@pytest.mark.parametrize("old_api", [False, True], ids=["parametrizations", "old-weight_norm"])
def test_weight_norm_of_a_zeroed_channel_is_a_zero_denominator(old_api: bool) -> None:
    """v/‖v‖ with a row of v all zeros is 0/0: an unsafe op, not bad initialization."""
    torch.manual_seed(0)
    model = _Net(old_api)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    with pytest.raises(NonFiniteError) as info, nanguard.attach(model, opt):
        for _ in range(3):
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
    f, d = info.value.finding, info.value.diagnosis
    assert (f.op, f.phase, f.step) == ("aten._weight_norm_interface.default", "forward", 0)
    assert f.module == ("fc1" if old_api else "fc1.parametrizations.weight.0")
    assert d is not None and d.cause is Cause.UNSAFE_OP and d.rule == "op_at_singularity"
    assert "the input `v` held 16 zeros out of 256" in d.evidence[0]
    assert "the denominator — is 0" in d.evidence[0] and "0/0 = nan" in d.evidence[0]
    assert contradictions(d) == []


def test_a_clip_overflow_is_marked_by_the_norm_clip_returned() -> None:
    """The replay marks the finding with the total norm clip_grad_norm_ returned (typed
    evidence); the rule reads that number, not the sink's description."""
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    with pytest.raises(NonFiniteError) as info, nanguard.attach(model, opt):
        for step in range(3):
            opt.zero_grad()
            (F.mse_loss(model(x), y) * (1e25 if step == 2 else 1.0)).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
    f, d = info.value.finding, info.value.diagnosis
    ev = f.evidence
    assert ev.update.clip_total_norm is not None and not math.isfinite(ev.update.clip_total_norm)
    assert ev.clip_overflow and d is not None and d.rule == "clip_norm_overflowed"
    assert d.cause is Cause.EXPLODING_GRADIENTS
