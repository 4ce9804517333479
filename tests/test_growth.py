"""A learning-rate back-off that grows back (``recover``), as a dynamic loss scale does."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import nanguard
from nanguard.core.growth import GROW_EVERY, Regrowth
from nanguard.core.history import History, StepRecord


def _history(losses: list[float], start: int = 0) -> History:
    h = History()
    for i, v in enumerate(losses):
        h.append(StepRecord(step=start + i, loss=v, grad_norm=1.0, param_norm=10.0, lr=0.01,
                            update_norm=0.01))
    return h


def _backed_off(losses: list[float]) -> tuple[Any, Any, Any]:
    """A ``recover`` controller over a history of ``losses`` that rolled back at step 20 (a
    learning-rate cause, a fake backend whose snapshot is step 19), and ``step(s, loss)``: one
    healthy step ended."""
    from nanguard.core.controller import StepController
    from nanguard.core.diagnosis import Diagnosis
    from nanguard.core.finding import Finding
    from nanguard.core.policy import RecoveryConfig
    from nanguard.core.taxonomy import Cause
    from test_controller import FakeBackend

    c = StepController(RecoveryConfig(policy="recover"), _history(losses))
    b = FakeBackend(snapshot_step=19)
    c.act(Finding(phase="forward", op="aten.mse_loss.default", step=20),
          Diagnosis(Cause.LEARNING_RATE_TOO_HIGH, 0.9, "lr"), b, step=20)

    def step(s: int, loss: float) -> None:
        c.history.append(StepRecord(step=s, loss=loss, grad_norm=1.0, param_norm=10.0, lr=0.01,
                                    update_norm=0.01))
        c.healthy()
        c.step_ended()

    return c, b, step


def test_a_back_off_grows_back_after_healthy_steps_and_a_raise_the_loss_cannot_bear_is_undone() -> None:
    h = History()
    g = Regrowth()
    g.backed_off(0)
    for i in range(GROW_EVERY - 1):
        h.append(StepRecord(step=i, loss=1.0 - 0.001 * i, grad_norm=1.0, param_norm=10.0, update_norm=0.01))
        assert g.step_ended(h, 0.01, judging=False) is None  # not yet 50 healthy steps
    h.append(StepRecord(step=GROW_EVERY, loss=0.95, grad_norm=1.0, param_norm=10.0, update_norm=0.01))
    assert g.step_ended(h, 0.01, judging=True) is None  # a recovery still being judged: wait
    change = g.step_ended(h, 0.01, judging=False)
    assert change is not None and change[0] == 0.02 and "50 healthy steps" in change[1]
    # on probation: the loss jumps tenfold three steps later → back to ×0.01, next wait doubled
    for k, v in enumerate((0.96, 1.5, 30.0), start=GROW_EVERY + 1):
        h.append(StepRecord(step=k, loss=v, grad_norm=1.0, param_norm=10.0, update_norm=0.01))
        change = g.step_ended(h, 0.02, judging=False)
    assert change is not None and change[0] == 0.01 and change[1].startswith("undone: the loss jumped to 30")
    assert g.every == 2 * GROW_EVERY and g.probation is None


def test_a_raise_kept_through_its_probation_lets_the_next_one_come() -> None:
    g = Regrowth()
    g.backed_off(0)
    h = _history([1.0] * 60)
    assert g.step_ended(h, 0.25, judging=False) == (0.5, "50 healthy steps since it last changed")
    h2 = _history([1.0] * 111)  # the same steady loss for another 50 steps
    for n in range(61, 111):  # steps 60..109: the probation ends at 59 + 50, kept
        assert g.step_ended(_history([1.0] * n), 0.5, judging=False) is None
    assert g.probation is None and g.last_change == 109
    assert g.step_ended(h2, 0.5, judging=False) is None  # the next raise waits 50 steps from there
    assert g.step_ended(_history([1.0] * 160), 0.5, judging=False) == (1.0, "50 healthy steps since it last changed")


def _regression(lr: float, steps: int, policy: str | None) -> tuple[float, object]:
    torch.manual_seed(0)
    x = torch.randn(1024, 8)
    y = x @ torch.randn(8, 1) + 0.1 * torch.randn(1024, 1)
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    guard = nanguard.attach(model, opt, policy=policy) if policy else None
    if guard is not None:
        guard.__enter__()
    try:
        for _ in range(steps):
            idx = torch.randint(0, 1024, (64,))
            opt.zero_grad()
            loss = F.mse_loss(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    finally:
        if guard is not None:
            guard.__exit__(None, None, None)
    return sum(losses[-50:]) / 50, guard


def test_recover_grows_a_back_off_far_below_the_sane_learning_rate_back_toward_it(capfd) -> None:  # type: ignore[no-untyped-def]
    """SGD at lr 300 (3000× the sane 0.1): the verified back-offs leave lr ≈ 0.025; grown back
    ×2 at a time, kept while the loss bears it, the run ends as well as the sane one."""
    sane, _ = _regression(0.1, 800, None)
    final, guard = _regression(300.0, 800, "recover")
    state = guard.recovery_state  # type: ignore[attr-defined]
    backed = min(r["lr_scale"] for r in state.recoveries if "lr_scale" in r)
    kept = [c for c in state.lr_changes if not c["why"].startswith("undone")]
    assert kept and state.lr_scale >= 4 * backed, state.lr_changes
    assert any(c["why"].startswith("undone: ") for c in state.lr_changes)  # the one too far went back
    assert final < 1.5 * sane, (final, sane)
    err = capfd.readouterr().err
    assert f"learning-rate back-off ×{backed:.3g} → ×{2 * backed:.3g} (50 healthy steps since it last changed)" in err
    # the history's learning rate shows the factor over time
    lrs = [r.lr for r in guard.history if r.lr is not None]  # type: ignore[attr-defined]
    assert abs(lrs[-1] - 300.0 * state.lr_scale) < 1e-9 and max(lrs[60:]) > 1.9 * min(lrs[60:])


def test_a_raise_that_diverges_the_weights_is_undone_with_a_rollback_to_before_it() -> None:
    """No snapshot is kept while a raise is on probation; when the loss jumps tenfold the raise
    is undone and the run goes back to the snapshot from before it (the damage is in the
    weights)."""
    c, b, step = _backed_off([1.0] * 20)
    s = 21
    while not c.state.lr_changes:
        assert c.snapshot_ok() or c.judge.judging
        step(s, 1.0)
        s += 1
    assert c.state.lr_scale == 1.0 and not c.snapshot_ok()  # on probation: no "last good" kept
    calls = len(b.calls)
    for loss in (1.0, 40.0):
        step(s, loss)
        s += 1
    change = c.state.lr_changes[-1]
    assert change["lr_scale"] == 0.5 and change["why"] == (
        "undone: the loss jumped to 40, ten times the 2 it kept before; rolled back to step 19")
    assert b.calls[calls:] == ["rollback", "settings_changed"]


def test_a_jump_that_stays_below_where_the_run_started_is_undone_without_a_rollback() -> None:
    """A converged classifier (loss 1e-4, started at 1.4) meets a batch at 3e-3 while a raise is
    on probation: the raise is undone, but nothing the run learned is thrown away."""
    c, b, step = _backed_off([1.4] + [1.0] * 19)
    s = 21
    while not c.state.lr_changes:
        step(s, 1e-4)
        s += 1
    calls = len(b.calls)
    step(s, 3e-3)
    assert c.state.lr_changes[-1]["why"] == "undone: the loss jumped to 0.003, ten times the 0.0002 it kept before"
    assert b.calls[calls:] == ["settings_changed"] and c.state.lr_scale == 0.5


def test_a_raise_that_trains_worse_is_undone_with_a_rollback_to_before_it() -> None:
    """The loss held at 1.0 before the raise and at 1.5 through its probation: the higher
    learning rate trains worse — the raise is undone and the weights go back to where it began
    (a spiral classifier with momentum drifted to chance after such an undo left its weights)."""
    c, b, step = _backed_off([1.0] * 20)
    s = 21
    while not c.state.lr_changes:
        step(s, 1.0)
        s += 1
    raised_at = s - 1
    while len(c.state.lr_changes) < 2:
        step(s, 1.5)
        s += 1
    change = c.state.lr_changes[-1]
    assert change["step"] == raised_at + GROW_EVERY and change["lr_scale"] == 0.5
    assert change["why"] == ("undone: the loss rose to 1.5, above the 1 it held at before the raise; "
                             "rolled back to step 19")
    assert "rollback" in b.calls[-2:]


def test_a_kept_raise_the_run_stops_bearing_later_is_a_relapse_undone_with_a_rollback() -> None:
    """An actor-critic's critic climbed from 0.4 to 1e17 at a constant back-off, with no NaN,
    after a raise was kept through its probation: nothing acted, and the back-off was even raised
    again at loss 1e17. Now the climb is a relapse: the factor is halved, the run goes back to the
    snapshot before the newest, no state is kept as "last good" while the loss is off its level,
    and the factor is never raised back to where it relapsed."""
    c, b, step = _backed_off([2.0] + [1.0] * 19)
    s = 21
    while not c.state.lr_changes:
        step(s, 1.0)
        s += 1
    raised = c.state.lr_scale
    for _ in range(GROW_EVERY):  # the probation: the loss holds, the raise is kept
        step(s, 1.0)
        s += 1
    assert len(c.state.lr_changes) == 1 and c.regrowth.probation is None
    calls = len(b.calls)
    for k in range(9):  # climbing: not yet ten steps above the bar
        step(s, 3.0 * 2 ** k)
        s += 1
        assert not c.snapshot_ok() or 3.0 * 2 ** k <= 11.0
    assert len(c.state.lr_changes) == 1
    step(s, 1e17)
    change = c.state.lr_changes[-1]
    assert change["lr_scale"] == raised / 2 and change["step"] == s
    assert change["why"] == ("relapsed: the loss's median over the last 10 steps is 72, far above the 1 it "
                             "held at when the back-off last grew; rolled back to step 19")
    assert b.calls[calls:] == ["rollback_older", "settings_changed"]
    for _ in range(8 * GROW_EVERY):  # healthy again for long: raised, but never back to `raised`
        s += 1
        step(s, 1.0)
    assert all(ch["lr_scale"] < raised for ch in c.state.lr_changes[2:]) and c.regrowth.relapses == 1


def test_a_loss_that_climbs_but_stays_below_where_the_run_started_is_no_relapse() -> None:
    """A run that started at 1000 and came down to 1: a climb to 50 after a kept raise is within
    what the run has been (a rollback would throw away what it learned), so nothing is done."""
    c, b, step = _backed_off([1000.0] + [1.0] * 19)
    s = 21
    calls = len(b.calls)
    while not c.state.lr_changes:
        step(s, 1.0)
        s += 1
    for _ in range(GROW_EVERY):
        step(s, 1.0)
        s += 1
    for _ in range(20):
        step(s, 50.0)
        s += 1
    assert not any(ch["why"].startswith("relapsed") for ch in c.state.lr_changes)
    assert "rollback_older" not in b.calls[calls:]


def test_the_summary_counts_a_relapse_apart_from_the_raises_undone_on_probation() -> None:
    from nanguard.core.render import recovery_summary

    rec = [{"step": 8, "cause": "exploding-gradients", "description": "rollback + learning rate ×0.1",
            "action": "rollback", "lr_scale": 0.1}]
    changes = [{"step": 60, "lr_scale": 0.2, "was": 0.1, "why": "50 healthy steps since it last changed"},
               {"step": 160, "lr_scale": 0.1, "was": 0.2, "why": "relapsed: the loss's median ..."}]
    text = recovery_summary(200, rec, 1, "recover", {"status": "recovered", "lr_scale": 0.1, "lr_changes": changes})
    assert text is not None
    assert ("the back-off grew back ×2 1 time after healthy stretches, 0 of the raises undone on probation, "
            "1 undone later when the loss climbed back (relapsed)") in text


def test_a_raise_whose_loss_moved_within_its_noise_is_kept() -> None:
    """A small regression whose batch losses range over ×3 moves its median by more than 5 %
    from one window to the next on noise alone: a raise judged on that was undone and rolled
    back 200 steps. The rise must exceed what the noise can make (a steady loss: 5 %)."""
    noisy = [0.5, 1.5] * 30
    g = Regrowth()
    g.backed_off(0)
    assert g.step_ended(_history(noisy), 0.25, judging=False) is not None  # raised at step 59
    later = noisy + [0.62, 1.62] * 25  # the median 1.0 → 1.12: 12 % up, within the noise
    assert g.step_ended(_history(later), 0.5, judging=False) is None
    assert g.probation is None and g.damaged is None  # kept
    g2 = Regrowth()
    g2.backed_off(0)
    g2.step_ended(_history(noisy), 0.25, judging=False)
    worse = noisy + [1.0, 2.6] * 25  # the median 1.0 → 1.8: beyond it
    change = g2.step_ended(_history(worse), 0.5, judging=False)
    assert change is not None and change[0] == 0.25 and g2.damaged == "rose"


def test_a_raise_that_trains_worse_within_the_runs_own_band_is_undone_without_a_rollback() -> None:
    """A noisy run (a loss of 1 with a batch at 3 every ten steps) holds 1.3 through a raise's
    probation: worse, so the raise is undone — but within the band the run kept before it, so
    the probation's steps are kept (a hand-written regression lost 200 steps to such a rollback
    and ended 3.9× its sane twin; 1.4× without it). Above the band, the rollback stays (the test
    above)."""
    c, b, step = _backed_off([1.0] * 20)
    s = 21
    while not c.state.lr_changes:
        step(s, 3.0 if s % 10 == 0 else 1.0)
        s += 1
    calls = len(b.calls)
    while len(c.state.lr_changes) < 2:
        step(s, 3.0 if s % 10 == 0 else 1.3)
        s += 1
    change = c.state.lr_changes[-1]
    assert change["why"] == "undone: the loss rose to 1.3, above the 1 it held at before the raise"
    assert "rollback" not in b.calls[calls:] and b.calls[-1] == "settings_changed"
