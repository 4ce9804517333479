"""The judged outcome, verified fixes, last-known-good snapshots and the repeated-drop stop, at
the step controller over a fake backend: exact decisions, calls and numbers."""

from __future__ import annotations

from typing import Any

import pytest

from nanguard.core.controller import MAX_REPEATED_DROPS, StepController
from nanguard.core.diagnosis import Diagnosis
from nanguard.core.errors import GiveUpError
from nanguard.core.finding import Finding
from nanguard.core.history import History, StepRecord
from nanguard.core.outcome import Level, OutcomeJudge, healthy_now
from nanguard.core.policy import RecoveryConfig
from nanguard.core.taxonomy import Cause
from nanguard.core.trials import Fix, Trial, lr_candidates
from test_controller import FakeBackend


def _history(n: int = 20, loss: float = 1.0) -> History:
    h = History()
    for i in range(n):  # calm: loss 1, |g| 1, |w| 10, lr 1e-3 (update/weight ratio 1e-4)
        h.append(StepRecord(step=i, loss=loss, grad_norm=1.0, param_norm=10.0, lr=1e-3))
    return h


def _ctl(policy: str = "recover") -> StepController:
    return StepController(RecoveryConfig(policy=policy), _history())


def _diag(cause: Cause) -> Diagnosis:
    return Diagnosis(cause, 0.9, cause.value)


def _finding(source: str | None = None) -> Finding:
    return Finding(phase="forward", op="aten.mse_loss.default", step=20, source=source)


def _step(c: StepController, step: int, loss: float, ratio: float = 1e-4) -> None:
    """One healthy step with this loss and update/weight ratio, ended."""
    c.history.append(StepRecord(step=step, loss=loss, grad_norm=1.0, param_norm=10.0, lr=ratio * 10.0))
    c.healthy()
    c.step_ended()


# --- the judge -----------------------------------------------------------------------------------


def test_level_is_the_lower_quartile_and_the_ceiling_twice_it() -> None:
    h = _history(16)
    for i, v in enumerate([5.0, 50.0, 500.0, 5000.0]):  # it diverged over its last 4 healthy steps
        h.append(StepRecord(step=16 + i, loss=v, grad_norm=1.0, param_norm=10.0, lr=1e-3))
    lv = Level.of(h)
    assert lv.loss == 1.0 and lv.ceiling == 2.0 and lv.steps == 20


def test_recovered_when_the_loss_is_back_at_the_end_of_the_window() -> None:
    c = _ctl()
    c.act(_finding(), _diag(Cause.LEARNING_RATE_TOO_HIGH), FakeBackend(snapshot_step=19), step=20)
    for s in range(21, 20 + c.judge.window):
        _step(c, s, 1.5)
    assert c.judge.current is not None and c.judge.current.status == "judging"  # decided at the end
    _step(c, 20 + c.judge.window, 1.5)
    out = c.run_ended(100)
    assert out is not None and out["status"] == "recovered" and out["decided_step"] == 70
    assert out["loss_before"] == 1.0 and out["loss_now"] == 1.5 and out["healthy_steps_since"] == 50


def test_a_run_that_diverged_from_its_start_must_get_below_where_it_started() -> None:
    c = StepController(RecoveryConfig(policy="skip"), _history(n=3, loss=1.386))  # 3 healthy steps only
    c.act(_finding(), _diag(Cause.LEARNING_RATE_TOO_HIGH), FakeBackend(), step=3)
    for s in range(4, 4 + c.judge.window):
        _step(c, s, 1.37)  # at chance level, a little under where it started: learned nothing
    out = c.run_ended(60)
    assert out is not None and out["status"] == "not-recovered"
    assert out["loss_ceiling"] == pytest.approx(1.386 * 0.95)


def test_not_recovered_after_the_window_says_by_how_much_and_escalates() -> None:
    c = _ctl()
    b = FakeBackend(snapshot_step=0)
    c.act(_finding(), _diag(Cause.LEARNING_RATE_TOO_HIGH), b, step=20)
    for s in range(21, 21 + c.judge.window):
        _step(c, s, 300.0, ratio=5.0)  # finite, but 300× the healthy loss, updates 5× the weights
    esc = c.state.recoveries[-1]
    assert esc["escalation"] == 1 and esc["lr_factor"] == lr_candidates(5.0, 0.1)[0] == 0.002
    assert esc["outcome"]["status"] == "not-recovered" and esc["outcome"]["loss_now"] == 300.0
    assert esc["restored_step"] == 0 and b.calls[-2:] == ["rollback_older", "settings_changed"]
    for s in range(100, 100 + 2 * c.judge.window):  # the escalations do not help either
        _step(c, s, 300.0, ratio=5.0)
    assert c.escalations == 2
    out = c.run_ended(400)
    assert out is not None and out["status"] == "not-recovered" and out["events"] == 3
    assert "loss 1 before the event, 300 now" in out["reason"]
    assert "update/weight ratio 5 now" in out["reason"]


def test_a_run_that_leaves_its_level_after_recovering_is_not_recovered_at_the_end() -> None:
    """Recovered at the end of the window, then the loss swings back far above the level (a
    back-off that was not enough): the run's end holds it to its verdict."""
    c = _ctl()
    c.act(_finding(), _diag(Cause.LEARNING_RATE_TOO_HIGH), FakeBackend(snapshot_step=19), step=20)
    for s in range(21, 21 + c.judge.window):
        _step(c, s, 1.2)
    assert c.judge.current is not None and c.judge.current.status == "recovered"
    for s in range(71, 200):
        _step(c, s, 1.2 if s % 3 else 30.0)  # a third of the steps 30×: still under the ceiling
    held = c.run_ended(200)
    assert held is not None and held["status"] == "recovered"
    for s in range(200, 230):
        _step(c, s, 8.0 if s % 4 else 0.9)  # the median of the last 20 is 8: four times the ceiling
    out = c.run_ended(230)
    assert out is not None and out["status"] == "not-recovered" and out["decided_step"] == 230
    assert out["reason"] == ("the loss came back to the run's healthy level, then left it again: over "
                             "the last 20 healthy steps its median is 8, above the healthy ceiling 2 "
                             "(loss 1 before the event)")


def test_a_verdict_too_recent_for_the_run_end_to_overturn_stays() -> None:
    """The last healthy losses must all be after the verdict to overturn it."""
    c = _ctl()
    c.act(_finding(), _diag(Cause.LEARNING_RATE_TOO_HIGH), FakeBackend(snapshot_step=19), step=20)
    for s in range(21, 21 + c.judge.window):
        _step(c, s, 1.2)
    for s in range(71, 80):
        _step(c, s, 9.0)
    out = c.run_ended(80)
    assert out is not None and out["status"] == "recovered"


def test_the_summary_gives_the_factor_in_force_after_the_back_off_grew_back() -> None:
    from nanguard.core.render import recovery_summary

    recs = [{"step": 5, "action": "rollback", "cause": "learning-rate-too-high", "lr_factor": 0.031,
             "lr_scale": 0.031, "description": "rollback + learning rate ×0.031", "verified": None}]
    outcome = {"status": "recovered", "reason": "r", "lr_scale": 0.124, "lr_changes": [
        {"step": 55, "lr_scale": 0.062, "was": 0.031}, {"step": 155, "lr_scale": 0.124, "was": 0.062},
        {"step": 158, "lr_scale": 0.062, "was": 0.124}, {"step": 258, "lr_scale": 0.124, "was": 0.062}]}
    text = recovery_summary(1000, recs, 1, "recover", outcome)
    assert text is not None and "the learning rate is now ×0.124 the script's" in text
    assert "the back-off grew back ×2 3 times after healthy stretches, 1 of the raises undone" in text
    plain = recovery_summary(1000, recs, 1, "recover", {"status": "recovered", "reason": "r"})
    assert plain is not None and "now ×0.031" in plain and "grew back" not in plain


def test_a_hand_written_updates_back_off_is_sized_by_the_weight_norms_change() -> None:
    """No optimizer, no learning rate: no update/weight ratio is measured. The weight norm's
    change between steps bounds it from below (|Δw| ≥ |‖w'‖ − ‖w‖|): weights that moved 30 % a
    step are backed off to a ratio of 1e-2 (×0.033), not halved."""
    h = History()
    norms = [10.0, 13.0, 16.9, 500.0, 9e4]  # the first update moved the weights ≥ 30 %
    for i, w in enumerate(norms):
        h.append(StepRecord(step=i, loss=1.0 + i, grad_norm=1.0, param_norm=w))
    assert h.median_update_ratio() is None
    assert h.norm_change_ratio() == pytest.approx(0.3)  # the lower quartile of 0.3, 0.3, 28.6, 179
    c = StepController(RecoveryConfig(policy="recover"), h)
    c.act(_finding(), _diag(Cause.LEARNING_RATE_TOO_HIGH), FakeBackend(), step=5)
    assert c.state.recoveries[-1]["lr_factor"] == 0.033
    calm = History()
    for i in range(10):  # weights that barely move: the usual halving
        calm.append(StepRecord(step=i, loss=1.0, grad_norm=1.0, param_norm=10.0 + 0.01 * i))
    c = StepController(RecoveryConfig(policy="recover"), calm)
    c.act(_finding(), _diag(Cause.LEARNING_RATE_TOO_HIGH), FakeBackend(), step=10)
    assert c.state.recoveries[-1]["lr_factor"] == 0.5


def test_with_two_optimizers_the_recovery_is_judged_on_the_primarys_loss() -> None:
    """An actor-critic: the critic (the first to step) has a loss that goes down; the actor's
    policy-gradient loss swings over orders of magnitude and is not meant to. The level, the
    ceiling and the verdict are the critic's."""
    h = History()
    for i in range(40):
        name, loss = ("Adam[0]", 1.0) if i % 2 == 0 else ("Adam[1]", -1e9 * (i % 5))
        h.append(StepRecord(step=i, loss=loss, grad_norm=1.0, param_norm=10.0, lr=1e-3, optimizer=name))
    c = StepController(RecoveryConfig(policy="recover"), History())
    for r in h:
        c.history.append(r)
        c.step_ended()
    c.act(_finding(), _diag(Cause.LEARNING_RATE_TOO_HIGH), FakeBackend(snapshot_step=39), step=40)
    for s in range(41, 41 + 2 * c.judge.window):
        name, loss = ("Adam[0]", 1.3) if s % 2 == 0 else ("Adam[1]", -3e9)
        c.history.append(StepRecord(step=s, loss=loss, grad_norm=1.0, param_norm=10.0, lr=1e-3, optimizer=name))
        c.healthy()
        c.step_ended()
    out = c.run_ended(41 + 2 * c.judge.window)
    assert out is not None and out["status"] == "recovered"
    assert out["loss_before"] == 1.0 and out["loss_ceiling"] == 2.0 and out["loss_now"] == 1.3


def test_a_run_that_ends_inside_the_window_is_judged_on_what_was_seen() -> None:
    c = _ctl("skip")
    c.act(_finding(), _diag(Cause.LEARNING_RATE_TOO_HIGH), FakeBackend(), step=20)
    _step(c, 21, 40.0)
    out = c.run_ended(22)  # one step seen: too few to say either way
    assert out is not None and out["status"] == "unjudged"
    assert out["reason"] == "the run ended 1 healthy step after the last event: too few to judge by (10 needed)"
    c = _ctl("skip")
    c.act(_finding(), _diag(Cause.LEARNING_RATE_TOO_HIGH), FakeBackend(), step=20)
    for s in range(21, 33):
        _step(c, s, 40.0)
    out = c.run_ended(33)  # twelve steps, all 40× the healthy loss
    assert out is not None and out["status"] == "not-recovered"
    assert out["reason"].startswith("the run ended 12 healthy steps after the last event")
    assert c.escalations == 0  # skip never escalates


def test_no_loss_before_the_event_is_unjudged_not_recovered() -> None:
    c = StepController(RecoveryConfig(policy="recover"), History())
    c.act(_finding(), _diag(Cause.NONFINITE_INPUT), FakeBackend(), step=0)
    c.history.append(StepRecord(step=1, loss=None, grad_norm=1.0))
    c.step_ended()
    out = c.run_ended(2)
    assert out is not None and out["status"] == "unjudged"


# --- verified fixes ------------------------------------------------------------------------------


def _down_when_small(limit: float) -> Any:
    """A fake trial: the loss goes down only with a learning-rate factor ≤ ``limit``."""
    def losses(fix: Fix) -> list[float]:
        f = fix.lr_factor if fix.lr_factor is not None else 1.0
        return [4.0, 3.5, 3.0, 2.5] if f <= limit else [4.0, 40.0, 400.0, float("nan")]
    return losses


def test_recovery_applies_the_first_verified_fix_with_its_numbers() -> None:
    c = _ctl()
    diag = _diag(Cause.LEARNING_RATE_TOO_HIGH)
    b = FakeBackend(snapshot_step=12, trials=_down_when_small(0.05))
    a = c.act(_finding(), diag, b, step=20)
    assert a.kind == "rollback" and a.lr_factor == 0.05  # ×0.5 failed, ×0.05 verified
    rec = c.state.recoveries[-1]
    assert rec["verified"] is True and [t["verified"] for t in rec["trials"]] == [False, True]
    assert rec["trials"][1]["losses"] == [4.0, 3.5, 3.0, 2.5] and rec["trials"][1]["from_step"] == 12
    assert rec["trials"][0]["losses"][-1] == "nan" and rec["trials"][0]["finite"] is False
    assert c.state.lr_scale == pytest.approx(0.05) and diag.trials == rec["trials"]
    assert b.calls[0] == ("trial", ["learning rate ×0.5", "learning rate ×0.05", "learning rate ×0.005",
                                  "learning rate ×5e-05", "learning rate ×5e-07", "learning rate ×5e-09"])


def test_no_verified_fix_stops_with_what_was_tried() -> None:
    c = _ctl()
    b = FakeBackend(trials=_down_when_small(1e-9))
    with pytest.raises(GiveUpError, match=r"no fix tried on the failing step.*learning rate ×0\.5: loss 4 → 40"):
        c.act(_finding(), _diag(Cause.LEARNING_RATE_TOO_HIGH), b, step=20)
    assert c.state.lr_scale == 1.0  # nothing was applied


def test_a_backend_that_cannot_retry_applies_the_fix_unverified() -> None:
    c = _ctl()
    a = c.act(_finding(), _diag(Cause.LEARNING_RATE_TOO_HIGH), FakeBackend(), step=20)
    rec = c.state.recoveries[-1]
    assert a.lr_factor == 0.5 and rec["verified"] is None and "trials" not in rec


def test_a_clip_is_not_switched_on_for_adam_nor_looser_than_the_scripts() -> None:
    for kw in ({"adaptive": True}, {"script_clip": 0.25}):
        c = _ctl()
        a = c.act(_finding(), _diag(Cause.EXPLODING_GRADIENTS), FakeBackend(), step=20, **kw)
        assert a.clip_norm is None, kw
    a = _ctl().act(_finding(), _diag(Cause.EXPLODING_GRADIENTS), FakeBackend(), step=20)
    assert a.clip_norm is not None  # plain SGD, no clip of its own: clipping is the fix


def test_trial_describes_itself() -> None:
    t = Trial(Fix(lr_factor=0.01), (2.0, 1.5), 3)
    assert t.verified and t.describe() == "learning rate ×0.01: loss 2 → 1.5 (verified)"
    assert not Trial(Fix(clip_norm=1.0), (2.0, 2.5), 3).verified


# --- last known good -----------------------------------------------------------------------------


def test_a_snapshot_is_last_known_good_only_when_the_run_is_healthy() -> None:
    h = _history()
    assert healthy_now(h)
    h.append(StepRecord(step=20, loss=1.0, grad_norm=1.0, param_norm=10.0, lr=2.0))  # ratio 0.2
    assert not healthy_now(h)
    grow = History()
    for i in range(8):  # weights ×1.3 per step
        grow.append(StepRecord(step=i, loss=1.0, grad_norm=1.0, param_norm=10.0 * 1.3**i, lr=1e-3))
    assert not healthy_now(grow)
    judge = OutcomeJudge()
    judge.acted(20, _history())
    assert not healthy_now(_history(), judge)  # an open episode, not yet back at its level


# --- repeated drops ------------------------------------------------------------------------------


def test_recover_stops_dropping_batches_from_one_source_after_a_stated_number() -> None:
    c = _ctl()
    b = FakeBackend()
    src = "train.py:41"
    for s in range(MAX_REPEATED_DROPS - 1):
        assert c.act(_finding(src), _diag(Cause.NONFINITE_INPUT), b, step=20 + 2 * s).kind == "drop_batch"
        _step(c, 21 + 2 * s, 1.0)
    with pytest.raises(GiveUpError, match=r"5 of the last 9 steps held non-finite values entering at train\.py:41"):
        c.act(_finding(src), _diag(Cause.NONFINITE_INPUT), b, step=28)


def test_scattered_bad_batches_are_dropped_without_stopping() -> None:
    c = _ctl()
    for s in range(0, 200, 10):  # one bad batch in ten: dropping them is the fix
        assert c.act(_finding("train.py:41"), _diag(Cause.NONFINITE_INPUT), FakeBackend(), step=s).kind == "drop_batch"
        c.healthy()


def test_state_carried_across_steps_stops_recover_with_the_first_event() -> None:
    c = _ctl()
    first = _finding()
    c.act(first, _diag(Cause.LEARNING_RATE_TOO_HIGH), FakeBackend(), step=20)
    carried = Finding(phase="forward", op="aten.mm.default", step=21, details={"origin": "carried"})
    with pytest.raises(GiveUpError, match="carries across steps") as info:
        c.act(carried, _diag(Cause.LEARNING_RATE_TOO_HIGH), FakeBackend(), step=21)
    assert info.value.finding is first and info.value.last is not None and info.value.last[0] is carried


def test_a_run_that_ends_at_the_event_is_unjudged() -> None:
    c = _ctl()
    c.act(_finding(), _diag(Cause.LEARNING_RATE_TOO_HIGH), FakeBackend(), step=20)
    out = c.run_ended(21)
    assert out is not None and out["status"] == "unjudged" and "ended at the last event" in out["reason"]


def _noisy(n: int, start: int = 0) -> list[StepRecord]:
    """A run at its plateau from the start: loss 5.4 ± 0.6, in a fixed pattern."""
    wiggle = [0.0, 0.5, -0.4, 0.6, -0.6, 0.2, -0.1, 0.4, -0.3, 0.1]
    return [StepRecord(step=start + i, loss=5.4 + wiggle[i % len(wiggle)], grad_norm=1.0, param_norm=10.0,
                       lr=1e-4) for i in range(n)]


def test_a_dropped_batch_after_a_few_noisy_steps_is_no_failure() -> None:
    # a regression loader with one inf target at step 7: the batch is dropped and the run goes on
    # like its clean twin — the first 7 steps are no level to fail it by (exit 4 before)
    h = History()
    for r in _noisy(7):
        h.append(r)
    judge = OutcomeJudge(window=50)
    judge.acted(7, h, bad_batch=True)
    decided = [judge.observe(r) for r in _noisy(50, start=8)]
    out = judge.current
    assert out is not None and decided[-1] is out and out.status in ("recovered", "unjudged"), out.to_dict()
    assert out.status == "recovered"  # back within its own band (5.4 ± 0.6) before the event
    assert out.ceiling == pytest.approx(6.0)


def test_a_dropped_batch_after_a_few_steps_and_a_worse_loss_is_unjudged_not_failed() -> None:
    h = History()
    for r in _noisy(7):
        h.append(r)
    judge = OutcomeJudge(window=50)
    judge.acted(7, h, bad_batch=True)
    for r in _noisy(50, start=8):
        judge.observe(StepRecord(step=r.step, loss=3 * r.loss, grad_norm=1.0, param_norm=10.0, lr=1e-4))
    out = judge.current
    assert out is not None and out.status == "unjudged"
    assert out.reason.startswith("only 7 healthy steps before the event: too few to know the run's level")


def test_a_rollback_after_a_few_steps_must_still_get_below_its_start() -> None:
    h = History()
    for r in _noisy(7):
        h.append(r)
    judge = OutcomeJudge(window=50)
    judge.acted(7, h)  # a rollback: the run diverged from its start; coming back means learning
    for r in _noisy(50, start=8):
        judge.observe(r)
    assert judge.current is not None and judge.current.status == "not-recovered"


def test_after_a_rollback_the_level_is_the_one_before_the_divergence_not_the_divergence() -> None:
    """A BatchNorm classifier's loss climbed for 50 finite steps before its first NaN; the run
    rolled back to a snapshot from before the climb. The level it must come back to is the
    loss before the climb (1.0), not the lower quartile of the climb itself."""
    h = History()
    for s in range(20):
        h.append(StepRecord(step=s, loss=1.0, grad_norm=1.0, param_norm=10.0, lr=0.1, update_norm=0.01))
    for s in range(20, 45):
        h.append(StepRecord(step=s, loss=10.0 ** (s - 18), grad_norm=1.0, param_norm=10.0, lr=0.1,
                            update_norm=0.01))
    c = StepController(RecoveryConfig(policy="recover"), h)
    c.act(Finding(phase="forward", op="aten.native_batch_norm.default", step=45),
          Diagnosis(Cause.LEARNING_RATE_TOO_HIGH, 0.9, "lr"), FakeBackend(snapshot_step=19), step=45)
    cur = c.judge.current
    assert cur is not None and cur.level.loss == 1.0 and cur.ceiling == 2.0
