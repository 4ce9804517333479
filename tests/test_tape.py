"""The step recorder's tape is a TorchFunctionMode: one event per torch call made outside modules
(not its aten ops), and a replay still names the aten op and the line that made a NaN."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nanguard
from nanguard.torch._recorder import TapeOp


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def _events_at_step(lr: float, loss_fn):  # type: ignore[no-untyped-def]
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    seen: list[list[str]] = []
    with nanguard.attach(model, opt) as g:
        # a local pre-step hook runs after the guard's global one: the step's events are complete
        opt.register_step_pre_hook(lambda o, a, k: seen.append(
            [type(e).__name__ + (":" + e.func.__name__ if isinstance(e, TapeOp) else "") for e in g.recorder.events]))
        for _ in range(3):
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
    return seen


def test_a_loss_function_is_one_tape_event_not_its_aten_ops() -> None:
    seen = _events_at_step(0.1, F.cross_entropy)
    # the dispatch-level tape saw _log_softmax, detach and nll_loss_forward here; the optimizer's
    # record_function and zero_grad's gradient setters are not the step's values
    assert seen[-1] == ["RootCall", "TapeOp:cross_entropy", "Backward"]


def test_hand_written_loss_records_each_call_and_its_in_place_write() -> None:
    def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = out * 2.0
        z.sub_(1.0)  # an in-place write: the replay re-runs it on its own copy
        p = torch.softmax(z, dim=1)
        return -torch.log(p.gather(1, y[:, None])).mean()

    seen = _events_at_step(0.1, loss_fn)
    assert seen[-1] == ["RootCall", "TapeOp:mul", "TapeOp:sub_", "TapeOp:softmax", "TapeOp:__getitem__",
                        "TapeOp:gather", "TapeOp:log", "TapeOp:mean", "TapeOp:neg", "Backward"]


def test_log_of_zero_outside_modules_is_still_located_at_its_call() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    with pytest.raises(nanguard.NonFiniteError) as info, nanguard.attach(model, opt):
        for step in range(4):
            opt.zero_grad()
            p = torch.softmax(model(x), dim=1)
            if step == 2:
                p = p * 0.0
            loss = -torch.log(p.gather(1, y[:, None])).mean()  # log(0) at step 2
            loss.backward()
            opt.step()
    f = info.value.finding
    assert (f.op, f.phase, f.step) == ("aten.log.default", "forward", 2)
    assert "test_tape.py:" in (f.source or "") and "torch.log(p.gather" in (f.source_code or "")
    assert f.inputs[0].zeros == 16 and f.neginf == 16


