"""Latent hazards seen by the watch (torch._hazard_watch): two sampled early steps under the
check's dispatch mode; a risky op on the path to the loss is an early warning with its line."""

from __future__ import annotations

import inspect
import io
from collections.abc import Callable
from contextlib import redirect_stderr

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nanguard
from nanguard.core.early import EarlyWarning
from nanguard.torch._hazard_watch import FOLLOW_HORIZON, SAMPLED_STEPS
from nanguard.torch.hazards import HazardMode

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _line(fn: Loss) -> str:
    """``test_hazard_watch.py:N``: the line of ``fn``'s return statement."""
    src, start = inspect.getsourcelines(fn)
    i = next(i for i, s in enumerate(src) if "return" in s)
    return f"tests/test_hazard_watch.py:{start + i}"


def _bce_by_hand(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return -(y * F.logsigmoid(z) + (1 - y) * torch.log(1 - torch.sigmoid(z))).mean()


def _bce_stable(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(z, y)


def _log_near_zero(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (torch.log(z.pow(2) * 1e-12 + 0.0) * 0.0).mean() + F.mse_loss(z, y)


def _masked_mean(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    m = (y > 0.5).float()
    return ((z - y).pow(2) * m).sum() / m.sum().clamp(min=1.0) + ((z - y).pow(2) * m).sum() / m.sum()


def _train(loss_fn: Loss, steps: int = 6, lbfgs: bool = False) -> tuple[list[EarlyWarning], str, nanguard.Guard]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    opt: torch.optim.Optimizer = (torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=2) if lbfgs
                                  else torch.optim.SGD(model.parameters(), lr=0.05))
    x, y = torch.randn(64, 4), (torch.rand(64, 1) > 0.5).float()
    err = io.StringIO()
    guard = nanguard.attach(model, opt)
    try:
        with redirect_stderr(err):
            for _ in range(steps):
                def closure() -> torch.Tensor:
                    opt.zero_grad()
                    loss = loss_fn(model(x), y)
                    loss.backward()
                    return loss
                if lbfgs:
                    opt.step(closure)
                else:
                    closure()
                    opt.step()
    finally:
        guard.detach()
    return list(guard.controller.early.warnings), err.getvalue(), guard


@pytest.mark.parametrize("lbfgs", [False, True])
def test_log_of_one_minus_sigmoid_is_warned_with_its_line_and_stable_form(lbfgs: bool) -> None:
    warnings, printed, guard = _train(_bce_by_hand, lbfgs=lbfgs)
    (w,) = warnings
    assert (w.kind, w.step) == ("latent-hazard", SAMPLED_STEPS[-1])
    assert w.message.startswith(f"`log` at {_line(_bce_by_hand)}")
    assert "log of 1 - sigmoid" in w.message and "F.logsigmoid(-z)" in w.message
    assert "nanguard: warning at step 2 (latent-hazard)" in printed
    assert guard.findings == []  # a warning, not a failure


def test_an_input_within_1e_6_of_zero_is_warned_by_its_margin() -> None:
    (w,) = _train(_log_near_zero)[0]
    assert w.kind == "latent-hazard" and w.message.startswith(f"`log` at {_line(_log_near_zero)}")
    assert "of 0 (< 1e-06)" in w.message


@pytest.mark.parametrize("loss_fn", [_bce_stable, _masked_mean])
def test_stable_forms_and_a_division_by_a_count_are_not_warned(loss_fn: Loss) -> None:
    warnings, printed, _ = _train(loss_fn)
    assert (warnings, printed) == ([], "")


def test_only_the_sampled_steps_are_looked_at() -> None:
    calls: list[int] = []
    orig = HazardMode.__torch_dispatch__

    def counting(self: HazardMode, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        calls.append(1)
        return orig(self, func, types, args, kwargs)

    HazardMode.__torch_dispatch__ = counting  # type: ignore[method-assign]
    try:
        _train(_bce_stable, steps=3)
        n3 = len(calls)
        _, _, g9 = _train(_bce_stable, steps=9)
    finally:
        HazardMode.__torch_dispatch__ = orig  # type: ignore[method-assign]
    assert n3 > 0 and len(calls) == 2 * n3  # steps 3..8 added nothing (the next look: step 25)
    assert not g9.hazards.looking and not g9.hazards.done
    from torch.utils._python_dispatch import _get_current_dispatch_mode
    assert _get_current_dispatch_mode() is None


def _angle(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(z, y) + 1e-3 * torch.acos(F.cosine_similarity(z, y + 0.5, dim=0)).mean()


def test_acos_of_a_cosine_is_warned_by_its_pattern() -> None:
    (w,) = _train(_angle)[0]
    assert (w.kind, w.step) == ("latent-hazard", SAMPLED_STEPS[-1])
    assert w.message.startswith(f"`acos` at {_line(_angle)}") and "cosine-like" in w.message


def test_an_evaluation_loop_between_steps_pauses_the_sampled_look() -> None:
    # minGPT's adder.py evaluates the whole dataset right after step 0, inside sampled step 1:
    # from the second no_grad forward on, the look's mode is popped until a forward builds a
    # graph again; the training forward of step 1 is looked at, and the hazard still warned
    from torch.utils._python_dispatch import _get_current_dispatch_mode
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(64, 4), (torch.rand(64, 1) > 0.5).float()
    modes: list[object] = []
    model.register_forward_pre_hook(lambda m, a: modes.append(_get_current_dispatch_mode()))
    err = io.StringIO()
    with redirect_stderr(err), nanguard.attach(model, opt) as guard:
        for step in range(4):
            opt.zero_grad()
            _bce_by_hand(model(x), y).backward()
            opt.step()
            if step == 0:
                with torch.no_grad():
                    for _ in range(5):
                        model(x)
    # forwards: step 0, five evaluation ones, then steps 1-3
    assert modes[0] is None and isinstance(modes[1], HazardMode)  # the first eval forward is seen
    assert modes[2:6] == [None] * 4  # the rest of the loop is not
    assert isinstance(modes[6], HazardMode) and isinstance(modes[7], HazardMode)  # steps 1 and 2
    assert modes[8] is None and not guard.hazards.looking and not guard.hazards.paused
    (w,) = guard.controller.early.warnings
    assert (w.kind, w.step) == ("latent-hazard", SAMPLED_STEPS[-1])
    assert _get_current_dispatch_mode() is None


def test_a_margin_walked_toward_zero_over_the_run_is_warned_with_the_step_it_gets_there(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A scale computed from a learned value (not a raw parameter under the op) walked down by
    constant gradient steps: nothing at steps 1–2 says so (its margin is 2.0 there), the later
    samples do — a straight line that reaches 0 at step 125, where sqrt makes the NaN. (The
    looks every 25 steps: this one-scalar step is so cheap that a traced one costs many, and
    the time budget would space them further.)"""
    import nanguard.torch._hazard_watch as hw

    monkeypatch.setattr(hw, "BUDGET", 1e6)
    a = nn.Parameter(torch.tensor(1.0))
    opt = torch.optim.SGD([a], lr=0.004)

    def loss() -> torch.Tensor:
        d = a * 2.0
        return d + 0.0 * torch.sqrt(d)  # the gradient of d is 2: a falls by 0.008 a step

    err, nan_step = io.StringIO(), None
    guard = nanguard.attach(None, opt)
    try:
        with redirect_stderr(err):
            for _ in range(200):
                opt.zero_grad()
                loss().backward()
                opt.step()
    except nanguard.NonFiniteError as e:
        nan_step = e.finding.step
    finally:
        guard.detach()
    warnings = guard.controller.early.warnings
    assert nan_step == 125, err.getvalue()
    w = next(w for w in warnings if w.kind == "margin-shrinking")
    assert w.step == 75 and w.projected_step == 125  # looked at steps 1, 2, 25, 50, 75
    assert "`sqrt`" in w.message and "on a straight line (R² 1.00); at this rate it reaches 0 at step ~125" in w.message
    assert f"nanguard: warning at step 75 (margin-shrinking): {w.message}" in err.getvalue()


def test_the_later_looks_are_spaced_by_what_a_sampled_step_costs() -> None:
    from nanguard.torch._hazard_watch import BUDGET, LATE_EVERY, LATE_MAX, _StepClock

    c = _StepClock()
    assert c.every() == LATE_EVERY  # nothing measured yet
    c._plain, c._sampled = 1e-3, 4e-3  # a traced step costs 3 plain ones more
    assert round(3.0 / BUDGET) == 150 and c.every() == 200  # 3 extra steps within 2 %: 150, rounded up
    c._sampled = 1.6e-3
    assert c.every() == 50  # 0.6 extra steps: 30, rounded up
    c._sampled = 1.1e-3  # large ops: the trace adds 10 %
    assert c.every() == LATE_EVERY
    c._sampled = 1.0  # a thousand times: capped, the margins still read now and then
    assert c.every() == LATE_MAX


def test_only_the_first_two_sampled_steps_link_a_recurrence(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recurrence rule is calibrated on initial weights: a healthy weight-shared block
    applied 12 times grew ×1.3 per call once trained (a chain of 12, never 362) and was warned
    at a later look. The later looks read margins, not recurrences."""
    import nanguard.torch._hazard_watch as hw

    monkeypatch.setattr(hw, "BUDGET", 1e6)
    seen: list[tuple[int | None, bool]] = []
    orig = HazardMode.__enter__

    def entering(self: HazardMode) -> HazardMode:
        seen.append((self.book.at, self.recurrences))
        return orig(self)

    monkeypatch.setattr(HazardMode, "__enter__", entering)
    _train(_bce_stable, steps=30)
    assert seen[:2] == [(1, True), (2, True)] and (25, False) in seen


class _NaiveSoftplus(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return torch.log1p(torch.exp(x))

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors  # type: ignore[attr-defined]
        return g * torch.sigmoid(x)


def _custom_softplus(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(_NaiveSoftplus.apply(z), y)  # type: ignore[no-untyped-call]


def test_a_custom_functions_naive_forward_is_warned_and_torch_is_left_as_it_was() -> None:
    """The look's steps see the ops of a custom ``autograd.Function``'s own forward (run with
    grad off inside ``apply``); its wrappers are gone once the look is over."""
    apply = torch.autograd.Function.__dict__["apply"]
    warnings, printed, guard = _train(_custom_softplus)
    (w,) = warnings
    assert (w.kind, w.step) == ("latent-hazard", SAMPLED_STEPS[-1])
    assert w.message.startswith("`log1p` at tests/test_hazard_watch.py:") and "F.softplus(x)" in w.message
    assert "nanguard: warning at step 2 (latent-hazard): `log1p`" in printed
    assert torch.autograd.Function.__dict__["apply"] is apply
    assert guard.findings == []


class _Variance(nn.Module):
    """A variance fitted as it is (no softplus): ``sqrt`` reads the raw parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.var = nn.Parameter(torch.ones(3))

    def forward(self, target: float | None) -> torch.Tensor:
        std = torch.sqrt(self.var)  # the raw parameter
        return std.sum() if target is None else (std - target).pow(2).sum()


def _walk(target: float | None, steps: int = 160) -> tuple[list[EarlyWarning], int | None]:
    """Adam walks the variance down ~0.01 a step: to 0 (``target`` None: a NaN near step 100),
    or to its optimum ``target**2`` and no further."""
    model = _Variance()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    guard = nanguard.attach(model, opt)
    failed = None
    try:
        with redirect_stderr(io.StringIO()):
            for step in range(steps):
                opt.zero_grad()
                model(target).backward()
                try:
                    opt.step()
                except nanguard.NonFiniteError:
                    failed = step
                    break
    finally:
        guard.detach()
    return list(guard.controller.early.warnings), failed


def test_a_raw_parameter_walked_to_zero_is_followed_between_the_looks_and_warned_close() -> None:
    """The later looks come back every 200 steps on a model this small; the parameter under the
    ``sqrt`` is read at every step between them, and its line warned within the horizon."""
    warnings, failed = _walk(None)
    assert failed is not None and failed > 60
    (w,) = [w for w in warnings if w.kind == "margin-shrinking"]
    assert w.message.startswith("`sqrt` at tests/test_hazard_watch.py:") and "reaches 0" in w.message
    assert w.projected_step is not None
    assert 3 <= failed - w.step <= FOLLOW_HORIZON + 3
    assert abs(w.projected_step - failed) <= FOLLOW_HORIZON


@pytest.mark.parametrize("target", [0.2, 0.5])
def test_a_raw_parameter_that_stops_at_its_optimum_is_not_warned(target: float) -> None:
    """The same walk, stopping at 0.04 or 0.25: until it stops it looks the same, so nothing is
    said while the edge is further than the horizon."""
    warnings, failed = _walk(target, 200)
    assert failed is None
    assert [w for w in warnings if w.kind == "margin-shrinking"] == []


def test_a_parameter_that_cannot_be_read_stops_the_following_and_not_the_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An error of ours while following (a parameter on a device the read cannot stack) ends
    the following silently: the run goes on and its NaN is still caught at its step."""
    from nanguard.torch import _hazard_watch

    def broken(reads: object) -> list[float]:
        raise RuntimeError("cannot stack")

    monkeypatch.setattr(_hazard_watch, "raw_margins", broken)
    warnings, failed = _walk(None)
    assert failed == 87
    assert [w for w in warnings if w.kind == "margin-shrinking"] == []
