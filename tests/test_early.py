"""Early warnings (core.early): growth that is fast and sustained is warned about before the NaN,
with its evidence and projected overflow step; spikes and healthy noise are not."""

from __future__ import annotations

import io
from contextlib import redirect_stderr
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nanguard
from nanguard import NonFiniteError
from nanguard.core.early import EarlyWarning, EarlyWarnings
from nanguard.core.history import History, StepRecord


def _run(records: list[dict[str, float]]) -> list[EarlyWarning]:
    h, ew = History(), EarlyWarnings()
    for i, r in enumerate(records):
        h.append(StepRecord(step=i, **r))
        ew.observe(h)
    return ew.warnings


def test_weights_growing_geometrically_are_warned_with_the_overflow_step() -> None:
    recs = [{"loss": 1.0, "param_norm": 10.0 * (1.01 ** i)} for i in range(20)]
    recs += [{"loss": 1.0, "param_norm": recs[-1]["param_norm"] * 2.0 ** k} for k in range(1, 5)]
    (w,) = _run(recs)
    assert (w.kind, w.step) == ("weights-growing", 21)  # the second ×2 in a row: ×4 over two
    assert "×2 a step for 2 steps" in w.message
    # |w| = 10·1.01^19·4 ≈ 48 growing ×2: float32's 3.4e38 in log2(3.4e38 / 48) ≈ 123 steps
    assert w.projected_step is not None and 140 <= w.projected_step <= 150


@pytest.mark.parametrize(("growth", "warned_at"), [(5.0, 20), (1.3, 22), (1.2, None)])
def test_the_weight_rule_weighs_speed_against_duration(growth: float, warned_at: int | None) -> None:
    """×4 in one step, ×3 over two, ×1.25 at each of three: each is far beyond healthy drift."""
    recs = [{"loss": 1.0, "param_norm": 10.0} for _ in range(20)]
    recs += [{"loss": 1.0, "param_norm": 10.0 * growth ** k} for k in range(1, 5)]
    got = [w.step for w in _run(recs) if w.kind == "weights-growing"]
    assert got == ([] if warned_at is None else [warned_at])


def test_a_spike_that_comes_back_is_not_a_warning() -> None:
    """An edge-of-stability run: the loss jumps ×30 for two steps and falls back; the
    gradient norm doubles twice; nothing is sustained."""
    recs = []
    for i in range(60):
        spike = 30.0 if i in (30, 31) else 1.0
        recs.append({"loss": 2.0 * spike * (0.99 ** i), "grad_norm": 1.0 * (4.0 if i in (30, 31) else 1.0),
                     "param_norm": 5.0 + 0.01 * i, "lr": 0.1, "update_norm": 0.05})
    assert _run(recs) == []


def test_a_loss_that_rises_but_stays_below_its_past_is_not_diverging() -> None:
    recs = [{"loss": 1000.0 / (i + 1)} for i in range(30)]  # it started high
    recs += [{"loss": 2.0 * 2.0 ** k} for k in range(5)]  # 2 → 32: rising, ×16, but < 1000
    assert _run(recs) == []


def test_gradients_updates_and_loss_each_have_their_rule() -> None:
    recs = [{"loss": 1.0 + 0.01 * i, "grad_norm": 1.0, "param_norm": 1.0, "lr": 1.0, "update_norm": 0.001}
            for i in range(10)]
    recs += [{"loss": 2.0 * 3.0 ** k, "grad_norm": 2.0 ** (k + 1), "param_norm": 1.0, "lr": 1.0,
              "update_norm": 1.2} for k in range(5)]
    kinds = {w.kind: w for w in _run(recs)}
    assert set(kinds) == {"gradients-growing", "updates-too-large", "loss-diverging"}
    assert kinds["updates-too-large"].step == 12  # third update at ratio 1.2
    assert kinds["gradients-growing"].step == 13  # 4 doublings from step 9
    assert kinds["loss-diverging"].step == 12  # 4 rises from step 8 (1.08 → 18: ×16.7)
    assert "(healthy ≈ 1e-3)" in kinds["updates-too-large"].message


@pytest.mark.parametrize(("growth", "warned_at"), [(30.0, 12), (9.0, None)])
def test_a_loss_growing_tenfold_three_times_is_diverging_a_step_sooner(growth: float,
                                                                       warned_at: int | None) -> None:
    """×30 at each of 3 steps (×2.7e4) is warned at the third; ×9 three times (×729, under
    ×1000) waits for the fourth rise of the slower rule, which comes after the end here."""
    recs = [{"loss": 1.0 - 0.01 * i} for i in range(10)]
    recs += [{"loss": 0.91 * growth ** k} for k in range(1, 4)] + [{"loss": 0.5}]
    got = [w for w in _run(recs) if w.kind == "loss-diverging"]
    assert [w.step for w in got] == ([] if warned_at is None else [warned_at])
    if got:
        assert "grew at each of the last 3 steps, ×30 a step" in got[0].message


def test_each_kind_is_said_once() -> None:
    recs = [{"loss": 1.0, "param_norm": 2.0 ** i} for i in range(12)]
    assert [w.kind for w in _run(recs)] == ["weights-growing"]


def _guarded_run(model: nn.Module, opt: torch.optim.Optimizer, loss: Any,
                 steps: int) -> tuple[list[EarlyWarning], int | None, str]:
    """``steps`` of zero_grad, ``loss().backward()``, ``opt.step()`` under an attached guard:
    its early warnings, the step of its finding (or None) and what it printed on stderr."""
    err, step = io.StringIO(), None
    guard = nanguard.attach(model, opt)
    try:
        with redirect_stderr(err):
            for _ in range(steps):
                opt.zero_grad()
                loss().backward()
                opt.step()
    except NonFiniteError as e:
        step = e.finding.step
    finally:
        guard.detach()
    return list(guard.controller.early.warnings), step, err.getvalue()


def _lr_run(lr: float, steps: int = 60) -> tuple[list[EarlyWarning], int | None, str]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x, y = torch.randn(64, 8), torch.randn(64, 1) * 3
    return _guarded_run(model, opt, lambda: F.mse_loss(model(x) ** 2, y), steps)


def test_a_diverging_torch_run_is_warned_before_its_first_nan() -> None:
    warnings, nan_step, printed = _lr_run(0.1, 60)  # NaN at step 26
    assert nan_step is not None and warnings, printed
    assert warnings[0].step <= nan_step - 3
    assert f"nanguard: warning at step {warnings[0].step} ({warnings[0].kind})" in printed


@pytest.mark.parametrize("lr", [1e-3, 0.05])
def test_a_healthy_torch_run_gets_no_warning(lr: float) -> None:
    warnings, nan_step, printed = _lr_run(lr)
    assert nan_step is None and warnings == [] and "warning" not in printed


def _embedding_run(make_opt: Any, steps: int = 6) -> tuple[list[EarlyWarning], int | None, str]:
    """Rows 5..9 of the embedding are never looked up: their gradient stays exactly 0."""
    torch.manual_seed(0)
    emb, head = nn.Embedding(10, 4), nn.Linear(4, 1)
    opt = make_opt([{"params": emb.parameters()}, {"params": head.parameters()}])
    return _guarded_run(nn.Sequential(emb, head), opt,
                        lambda: head(emb(torch.randint(0, 5, (8,)))).pow(2).mean(), steps)


def test_adam_with_eps_zero_is_warned_before_its_first_update() -> None:
    warnings, nan_step, printed = _embedding_run(lambda g: torch.optim.Adam(g, lr=1e-2, eps=0))
    (w,) = warnings
    assert (w.step, w.kind, nan_step) == (0, "optimizer-eps-zero", 0)
    assert w.message.startswith("`torch.optim.Adam(eps=0)`: its update divides by the root of the "
                                "squared-gradient average plus eps")
    assert printed.startswith("nanguard: warning at step 0 (optimizer-eps-zero): ")


def test_eps_zero_in_one_group_is_named_and_the_default_eps_is_not_warned() -> None:
    def rms(groups: Any) -> torch.optim.Optimizer:
        groups[1]["eps"] = 0.0
        return torch.optim.RMSprop(groups, lr=1e-3)

    (w,) = _embedding_run(rms, steps=2)[0]
    assert w.message.startswith("`torch.optim.RMSprop(eps=0)` (parameter group 1): ")
    warnings, nan_step, _ = _embedding_run(lambda g: torch.optim.Adam(g, lr=1e-2))
    assert warnings == [] and nan_step is None
    assert _embedding_run(lambda g: torch.optim.SGD(g, lr=1e-2))[0] == []


def test_no_warning_is_said_after_the_runs_first_nonfinite_value() -> None:
    """A warning comes before the first NaN or not at all: once the controller handles a
    non-finite step, a hazard sampled at it or a rule read after a skip says nothing."""
    said: list[EarlyWarning] = []
    early = EarlyWarnings(said.append)
    assert early.add(EarlyWarning(3, "latent-hazard", "before"))
    early.close()
    assert not early.add(EarlyWarning(4, "data-nonfinite", "after"))
    assert [w.message for w in said] == ["before"] and len(early.warnings) == 1


def test_a_skipped_nan_step_closes_the_warnings_of_a_torch_run() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = nanguard.attach(model, opt, policy="skip")
    try:
        for step in range(3):
            x = torch.randn(8, 4)
            if step == 1:
                x[0, 0] = float("nan")
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
    finally:
        guard.detach()
    assert guard.controller.early.closed and guard.total_notfinite == 1


def test_weights_leaving_a_zero_initialisation_are_learning_not_growing() -> None:
    """A logistic regression from zero weights: the norm grows ×2, ×1.5, ×1.33 (linearly, each
    update about as large): the old rule said "×1.57 a step … float32 overflows at step ~205"."""
    linear = [{"loss": 0.69 - 0.001 * i, "param_norm": 0.035 * i} for i in range(1, 40)]
    assert _run(linear) == []
    # SGD with momentum 0.9 from zero: the updates grow while the velocity builds, then settle
    v, norm, momentum = 0.0, 0.0, []
    for i in range(40):
        v = 0.9 * v + 0.01
        norm += v
        momentum.append({"loss": 0.69 - 0.001 * i, "param_norm": norm})
    assert _run(momentum) == []


def test_a_saturating_rise_is_not_diverging_and_an_accelerating_one_is() -> None:
    """An RL loss that follows longer episodes (×4, ×2, ×1.5, ×1.3: the rate falls off) against
    the same start growing ×2.5 at each step."""
    start = [{"loss": 5.0 - 0.01 * i, "grad_norm": 1.0} for i in range(10)]
    saturating = [{"loss": 4.9 * f, "grad_norm": 2.0 * f} for f in (4, 8, 12, 15.6, 17)]
    assert _run(start + saturating) == []
    geometric = [{"loss": 4.9 * 2.5 ** k, "grad_norm": 2.0 * 2.5 ** k} for k in range(1, 6)]
    kinds = [w.kind for w in _run(start + geometric)]
    assert kinds == ["loss-diverging", "gradients-growing"]


def test_a_loss_bouncing_below_where_the_run_started_is_not_diverging() -> None:
    """A Keras CNN late in training: its batch loss rose 0.0018 → 0.145 over 4 batches, above the
    50 before, yet far below the 2.3 it started at."""
    recs = [{"loss": 2.3 * 0.9 ** i} for i in range(60)] + [{"loss": 0.001}]
    recs += [{"loss": v} for v in (0.0018, 0.006, 0.03, 0.145)]
    assert _run(recs) == []
    recs += [{"loss": v} for v in (0.8, 3.0, 12.0)]  # past the start, still rising: diverging
    (w,) = _run(recs)
    assert (w.kind, w.step) == ("loss-diverging", 66)


def test_weights_growing_slowly_and_steadily_are_warned_without_a_projection() -> None:
    """×1.05 a step from step 0 (a MAP fit whose prior's sign is flipped): below the fast rules,
    warned once it has held for 20 steps and doubled the norm (step 20: ×1.05^20 = 2.65)."""
    recs = [{"loss": 1.0 + 0.01 * i, "param_norm": 3.0 * 1.05 ** i} for i in range(40)]
    (w,) = _run(recs)
    assert (w.kind, w.step, w.projected_step) == ("weights-growing", 20, None)
    assert "grew at each of the last 20 steps, ×2.65 over them (×1.05 a step, not slowing" in w.message


@pytest.mark.parametrize("shape", ["linear", "sqrt", "noisy"])
def test_weights_growing_as_learning_does_are_not_warned(shape: str) -> None:
    """Norms that rise at every step for a long time as healthy training makes them: linearly
    (Adam from zero), as √t (no weight decay), or geometrically but only ×1.5 over 20 steps."""
    g = torch.Generator().manual_seed(0)
    noise = (1 + 0.002 * torch.rand(200, generator=g)).tolist()
    norm = {"linear": lambda i: 0.01 * (i + 1), "sqrt": lambda i: (i + 1) ** 0.5,
            "noisy": lambda i: 5.0 * 1.02 ** i * noise[i]}[shape]
    recs = [{"loss": 1.0, "param_norm": norm(i)} for i in range(200 if shape != "noisy" else 21)]
    assert _run(recs) == []


def test_a_gradient_burst_no_higher_than_the_run_has_been_is_not_growing() -> None:
    """A mixture density net's gradients (∝ 1/σ²) burst ×2 a step for 4 steps, to 2400, after
    an earlier burst to 2500 it came back from: not a divergence; the same burst to 5000 is."""
    quiet = [{"loss": -2.0, "grad_norm": 150.0} for _ in range(20)]
    earlier = [{"loss": -2.0, "grad_norm": g} for g in (600.0, 2500.0, 300.0)] + quiet
    burst = [{"loss": -2.0, "grad_norm": 150.0 * 2.0 ** (k + 1)} for k in range(4)]
    assert _run(quiet + earlier + burst) == []
    higher = [{"loss": -2.0, "grad_norm": 150.0 * 2.0 ** (k + 1)} for k in range(5)]
    (w,) = _run(quiet + earlier + higher)
    assert w.kind == "gradients-growing" and "300 → 4.8e+03" in w.message


def test_a_gradient_burst_no_longer_than_one_the_run_came_back_from_is_not_growing() -> None:
    """Heavy-tailed gradients burst for 5 steps (×1.4-2 a step, ×17) and fall back; a later
    burst of 5 steps reaches above the earlier top: no warning while it is no longer than the
    earlier one; the step it outlasts it (a 6th rise), it is warned."""
    quiet = [{"loss": -2.0, "grad_norm": 150.0 - (i % 2)} for i in range(20)]  # ends on a fall
    earlier = [{"loss": -2.0, "grad_norm": g} for g in (270.0, 380.0, 760.0, 1500.0, 2500.0)] + quiet
    five = [{"loss": -2.0, "grad_norm": 140.0 * 2.0 ** (k + 1)} for k in range(5)]  # to 4480
    assert [w.kind for w in _run(quiet + earlier + five)] == []
    six = [*five, {"loss": -2.0, "grad_norm": 140.0 * 2.0 ** 6}]
    (w,) = _run(quiet + earlier + six)
    assert (w.kind, w.step) == ("gradients-growing", len(quiet + earlier + six) - 1)
    # a rise as long that never reached ×10 is not a burst: the later one warns at its 4th rise
    small = [{"loss": -2.0, "grad_norm": 150.0 * 1.5 ** (k + 1)} for k in range(5)] + quiet  # ×7.6
    (w,) = _run(quiet + small + five)
    assert (w.kind, w.step) == ("gradients-growing", len(quiet + small + five) - 2)


class _Salary(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 16), nn.ReLU())
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x)).squeeze(-1)


def _salary_run(top: float, how: str) -> list[EarlyWarning]:
    """Two steps of a regression on targets up to ``top`` whose model outputs float16: under
    autocast (``"autocast"``), with float16 weights (``"half"``), or under autocast with the
    prediction rescaled before the loss (``"rescaled"``: the output need not reach the targets)."""
    torch.manual_seed(0)
    model = _Salary().half() if how == "half" else _Salary()
    if how == "zero-head":
        nn.init.zeros_(model.head.weight)
        nn.init.zeros_(model.head.bias)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(32, 4)
    y = torch.linspace(top / 4, top, 32)

    def loss() -> torch.Tensor:
        if how == "half":
            return F.l1_loss(model(x.half()).float(), y)
        with torch.autocast("cpu", dtype=torch.float16):
            pred = model(x)
        return nn.L1Loss()(pred.float() * (1000.0 if how in ("rescaled", "zero-head") else 1.0), y)

    return _guarded_run(model, opt, loss, 2)[0]


@pytest.mark.parametrize("how", ["autocast", "half"])
def test_regression_targets_beyond_float16_are_warned_at_the_first_step(how: str) -> None:
    (w,) = _salary_run(1.2e5, how)
    assert (w.step, w.kind) == (0, "low-precision-headroom")
    assert w.message.startswith("the regression targets reach 1.2e+05, beyond float16's largest value 65504")
    assert ("under torch.autocast(float16)" if how == "autocast" else "its weights are float16") in w.message


@pytest.mark.parametrize(("top", "how"), [(4.2e4, "autocast"), (1.2e5, "rescaled"), (1.2e5, "zero-head")])
def test_targets_within_float16_or_a_rescaled_output_are_not_warned(top: float, how: str) -> None:
    """Targets below 65504; an output rescaled before the loss; a zero-initialised output layer
    rescaled (at step 0 it equals any rescaling of itself: no telling)."""
    assert _salary_run(top, how) == []


def test_a_slow_climb_or_a_paused_rise_is_no_burst_to_excuse_a_later_explosion() -> None:
    """A 60-step warm-up climb of the gradient norm (×30 over it), and a rise that pauses for
    one step without coming back, are not bursts the run came back from: the ×2-a-step
    explosion after each is warned at its 4th rise, as in a run without them. A skipped step
    (a loss scaler's, no norm) in the middle of a rise neither ends nor counts in it."""
    climb = [{"loss": 1.0, "grad_norm": 0.1 * 1.06 ** i} for i in range(60)]  # ×33
    settle = [{"loss": 1.0, "grad_norm": 1.0 - 0.01 * (i % 2)} for i in range(10)]
    boom = [{"loss": 1.0, "grad_norm": 2.0 ** (k + 1)} for k in range(6)]
    (w,) = _run(climb + settle + boom)
    assert (w.kind, w.step) == ("gradients-growing", len(climb + settle) + 3)
    paused = [{"loss": 1.0, "grad_norm": 1.4 ** k} for k in range(8)] + [{"loss": 1.0, "grad_norm": 9.0}]
    on = [{"loss": 1.0, "grad_norm": 9.0 * 2.0 ** (k + 1)} for k in range(5)]  # ×10.5, paused, on ×2
    (w,) = _run(settle + paused + on)
    assert (w.kind, w.step) == ("gradients-growing", len(settle + paused) + 3)
    h, ew = History(), EarlyWarnings()
    recs = [*settle, *boom[:2], {"loss": None, "grad_norm": None, "skipped": True}, *boom[2:]]
    for i, r in enumerate(recs):
        h.append(StepRecord(step=i, **r))
        ew.observe(h)
    assert ew._grad_rise.get(None, (0, 0.0))[0] == 6  # the skip did not end the rise


def test_the_first_steps_capture_keeps_one_model_output_however_many_evaluations_run_first() -> None:
    """Evaluation forwards before the first training step (no graph) leave no output in the
    capture the targets' check reads: only the model's first forward with grad, one batch."""
    torch.manual_seed(0)
    model = _Salary()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    guard = nanguard.attach(model, opt)
    try:
        with torch.no_grad():
            for _ in range(5):
                model(torch.randn(64, 4))
        out = model(torch.randn(32, 4))
        capture = guard.recorder.capture
        assert capture is not None
        outs = [c for c in capture if c[0] == "out"]
        assert len(outs) == 1 and outs[0][2] is out
        F.l1_loss(out, torch.zeros(32)).backward()
        opt.step()
        assert guard.recorder.capture is None  # let go when the first step ends
    finally:
        guard.detach()
