"""The step controller over a fake backend: every event order real training produces, each
asserting the exact decision, what the backend was asked to do, and what the run log gets."""

from __future__ import annotations

from typing import Any

import pytest

from nanguard.core.controller import StepController
from nanguard.core.diagnosis import Diagnosis
from nanguard.core.errors import GiveUpError, NonFiniteError
from nanguard.core.finding import Finding
from nanguard.core.history import History, StepRecord
from nanguard.core.policy import ROLLBACK, UNFIXABLE, RecoveryConfig
from nanguard.core.taxonomy import Cause
from nanguard.core.trials import Fix, Trial


class FakeBackend:
    """Records what the controller asked for, in order."""

    def __init__(self, snapshot_step: int | None = 0, trials: Any = None) -> None:
        self.calls: list[Any] = []
        self.snapshot_step = snapshot_step
        self.trials = trials  # fix -> losses of its trial; None: this backend cannot try fixes

    def skip_update(self) -> None:
        self.calls.append("skip_update")

    def rollback(self, older: bool = False) -> int | None:
        self.calls.append("rollback_older" if older else "rollback")
        return self.snapshot_step

    def trial(self, fixes: list[Fix]) -> list[Trial] | None:
        if self.trials is None:
            return None
        self.calls.append(("trial", [f.describe() for f in fixes]))
        out = []
        for f in fixes:
            out.append(Trial(f, tuple(self.trials(f)), self.snapshot_step))
            if out[-1].verified:
                break
        return out

    def across_ranks(self, values: tuple[float | None, ...]) -> list[tuple[float | None, ...]]:
        return [values]

    def settings_changed(self) -> None:
        self.calls.append("settings_changed")

    def set_eps(self, eps: float) -> None:
        self.calls.append(("set_eps", eps))

    def restore_state(self) -> dict[str, Any]:
        self.calls.append("restore_state")
        return {}


def _controller(policy: str = "recover", **kw: Any) -> StepController:
    h = History()
    for i in range(10):  # a calm history: loss 1, grad norm 1, weights 10, lr 1e-3
        h.append(StepRecord(step=i, loss=1.0, grad_norm=1.0, param_norm=10.0, lr=1e-3))
    return StepController(RecoveryConfig(policy=policy, **kw), h)


def _event(cause: Cause, step: int = 10, **details: Any) -> tuple[Finding, Diagnosis]:
    f = Finding(phase="forward", op="aten.log.default", step=step, details=dict(details))
    return f, Diagnosis(cause=cause, confidence=0.9, summary=cause.value)


def test_every_cause_has_exactly_one_recovery_rule() -> None:
    for cause in Cause:
        rules = [cause in ROLLBACK, cause in UNFIXABLE, cause is Cause.NONFINITE_INPUT]
        assert sum(rules) == 1, cause


def test_raise_policy_raises_and_remembers_the_error() -> None:
    c = _controller("raise")
    b = FakeBackend()
    with pytest.raises(NonFiniteError):
        c.act(*_event(Cause.UNSAFE_OP), b, step=10)
    assert b.calls == [] and len(c.findings) == 1 and c.swallowed() is None


def test_an_error_the_script_swallowed_is_reported_after_the_next_step() -> None:
    c = _controller("raise")
    f, d = _event(Cause.NONFINITE_INPUT, step=3)
    with pytest.raises(NonFiniteError):
        c.act(f, d, FakeBackend(), step=3)
    c.step_ended()  # the failing step is ended cleanly
    assert c.swallowed() is not None  # ... and the script went on: caught it
    c.healthy()
    c.step_ended()
    got = c.swallowed()
    assert got is not None and got[0] is f and got[2] == 3 and c.steps_after_raise == 2


def test_skip_hides_the_update_and_counts() -> None:
    c = _controller("skip", max_consecutive_skips=3)
    b = FakeBackend()
    a = c.act(*_event(Cause.UNSAFE_OP), b, step=10)
    assert a.kind == "skip" and b.calls == ["restore_state", "skip_update"]
    assert c.state.notfinite_count == 1 and c.state.recoveries[0]["action"] == "skip"
    c.act(*_event(Cause.UNSAFE_OP), b, step=11)
    with pytest.raises(GiveUpError):
        c.act(*_event(Cause.UNSAFE_OP), b, step=12)
    c2 = _controller("skip", max_consecutive_skips=3)
    c2.act(*_event(Cause.UNSAFE_OP), b, step=10)
    c2.healthy()  # a healthy step in between: the consecutive count starts over
    assert c2.state.notfinite_count == 0


def test_drop_batch_logs_the_samples() -> None:
    c = _controller()
    f, d = _event(Cause.NONFINITE_INPUT, samples=[{"index": 5}, {"index": 9}], input_name="x")
    a = c.act(f, d, FakeBackend(), step=10)
    assert a.kind == "drop_batch"
    assert c.state.recoveries[-1]["samples"] == [5, 9] and c.state.recoveries[-1]["input"] == "x"


def test_rollback_restores_the_snapshot_and_backs_off() -> None:
    c = _controller()
    b = FakeBackend(snapshot_step=4)
    a = c.act(*_event(Cause.LEARNING_RATE_TOO_HIGH), b, step=10)
    assert a.kind == "rollback" and a.lr_factor is not None and a.lr_factor <= 0.5
    assert b.calls == ["rollback", "restore_state", "skip_update"]
    rec = c.state.recoveries[-1]
    assert rec["restored_step"] == 4 and rec["steps_lost"] == 6
    assert c.state.lr_scale == a.lr_factor


def test_optimizer_state_with_eps_zero_raises_eps() -> None:
    c = _controller()
    b = FakeBackend()
    a = c.act(*_event(Cause.OPTIMIZER_STATE), b, step=10, eps=0.0, after_update=True)
    assert a.set_eps == 1e-8 and ("set_eps", 1e-8) in b.calls and "skip_update" not in b.calls


def test_a_bad_update_with_no_snapshot_gives_up_instead_of_going_on() -> None:
    c = _controller()
    b = FakeBackend(snapshot_step=None)
    with pytest.raises(GiveUpError) as info:
        c.act(*_event(Cause.OPTIMIZER_STATE), b, step=10, eps=0.0, after_update=True)
    assert "no snapshot" in info.value.reason


def test_a_rollback_before_the_first_snapshot_skips_the_update() -> None:
    c = _controller()
    b = FakeBackend(snapshot_step=None)
    c.act(*_event(Cause.EXPLODING_GRADIENTS), b, step=10)
    assert b.calls[-1] == "skip_update" and c.state.recoveries[-1]["restored_step"] is None


def test_unfixable_cause_under_recover_raises() -> None:
    c = _controller()
    with pytest.raises(NonFiniteError):
        c.act(*_event(Cause.UNSAFE_OP), FakeBackend(), step=10)


def test_loss_scaler_skips_are_its_own_business_until_it_runs_out_of_room() -> None:
    c = _controller("raise")
    # before any update and mid-run: a skip at a scale with room to shrink is never a failure
    for _ in range(20):
        assert c.scaler_skipped(nan_loss=False, scale=2.0**24) is None
    c.scaler_stepped()
    assert c.scaler_skips == 0
    assert c.scaler_skipped(nan_loss=False, scale=1.0) is not None  # no room left
    reason = c.scaler_skipped(nan_loss=True, scale=2.0**16)
    assert reason is not None and "not finite" in reason


def test_state_dict_round_trip_keeps_the_back_off() -> None:
    c = _controller()
    c.act(*_event(Cause.LEARNING_RATE_TOO_HIGH), FakeBackend(4), step=10)
    state = c.state_dict()
    fresh = _controller()
    fresh.load_state_dict(state)
    assert fresh.state.lr_scale == c.state.lr_scale < 1.0
    assert fresh.state.recoveries == c.state.recoveries
    with pytest.raises(ValueError, match="state_dict"):
        fresh.load_state_dict({"lr_scale": 0.1})


def test_history_of_one_optimizer() -> None:
    h = History()
    for i in range(6):
        h.append(StepRecord(step=i, loss=float(i), optimizer="Adam" if i % 2 else "SGD"))
    assert [r.step for r in h.of("Adam")] == [1, 3, 5]
    assert h.of(None) is h


class _TwoRanks(FakeBackend):
    """Rank 0 of two: the other rank measured ``other`` (its update/weight ratio, its clip)."""

    def __init__(self, other: tuple[float | None, float | None], **kw: Any) -> None:
        super().__init__(**kw)
        self.other = other

    def across_ranks(self, values: tuple[float | None, ...]) -> list[tuple[float | None, ...]]:
        return [values, self.other]


def test_every_rank_backs_off_by_the_same_factor_the_strongest_any_rank_measured() -> None:
    # the ranks' shards of the weights moved by different ratios (FSDP2): each measured its own
    # back-off (×0.0094 and ×0.0083 on a real 2-rank run); both now apply the stronger one
    c = _controller()
    for i in range(10):
        c.history[i].update_norm = 10.0  # ratio 1
    mine = c.act(*_event(Cause.LEARNING_RATE_TOO_HIGH), _TwoRanks((2.0, None)), step=10)
    c2 = _controller()
    for i in range(10):
        c2.history[i].update_norm = 20.0  # ratio 2
    theirs = c2.act(*_event(Cause.LEARNING_RATE_TOO_HIGH), _TwoRanks((1.0, None)), step=10)
    assert mine.lr_factor == theirs.lr_factor == pytest.approx(0.005)


def test_combined_trials_verify_a_fix_only_where_every_rank_verified_it() -> None:
    from nanguard.core.trials import combine_ranks

    a, b = Fix(0.1), Fix(0.01)
    rank0 = [Trial(a, (5.0, 4.0, 3.0, 2.0), 0), Trial(b, (5.0, 4.9, 4.8, 4.7), 0)]
    rank1 = [Trial(a, (6.0, 7.0, 9.0, 12.0), 0), Trial(b, (6.0, 5.9, 5.8, 5.7), 0)]
    both = combine_ranks([rank0, rank1])
    assert both is not None and [t.verified for t in both] == [False, True]
    assert both[0] == rank1[0]  # the rank where it failed speaks for the fix
    assert both[1].losses == pytest.approx((11.0, 10.8, 10.6, 10.4))  # the whole step's loss
    assert combine_ranks([rank0, None]) is None  # a rank that could not re-run the step: untried
    c = Fix(0.001)  # tried too (every rank tries every fix), but listed no further than one process
    both = combine_ranks([[*rank0, Trial(c, (5.0, 4.0), 0)], [*rank1, Trial(c, (6.0, 5.0), 0)]])
    assert both is not None and [t.fix for t in both] == [a, b]


def test_each_event_is_said_as_it_happens_and_thousands_are_counted(capsys: pytest.CaptureFixture[str]) -> None:
    c = _controller(policy="skip", max_consecutive_skips=10_000)
    for s in range(10, 10 + 120):
        c.act(*_event(Cause.NONFINITE_INPUT, step=s), FakeBackend(), step=s)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "nanguard: step 10: nonfinite-input → skip"
    assert len(lines) == 10 + 3  # the first 10, then at 20, 50 and 100 — and none for the others
    assert lines[10].startswith("nanguard: 20 non-finite steps so far; the last, step 29: nonfinite-input")
    assert lines[-1].startswith("nanguard: 100 non-finite steps so far; the last, step 109")


def test_a_rollback_says_whether_its_fix_was_tried() -> None:
    from nanguard.core.render import event_line

    rec = {"step": 4, "action": "rollback", "cause": "learning-rate-too-high", "steps_lost": 4,
           "description": "rollback + learning rate ×0.01", "verified": True}
    assert event_line(rec, 1) == ("nanguard: step 4: learning-rate-too-high → rollback + learning rate ×0.01, "
                                  "4 steps lost (verified on the failing step)")
    assert event_line({**rec, "verified": None}, 2).endswith("4 steps lost (untried: judged by the outcome)")
    assert event_line(rec, 11) is None and event_line(rec, 1000) is not None


def test_a_learning_rate_cause_is_never_cured_by_dropping_batches_for_ever() -> None:
    """Steps of a rollback cause that fail at the healthy weights whatever the fix get their
    batch skipped — but not without end (SAC at a learning rate 10⁶× too high was "fixed" by 2,735
    drops): spread too far apart for the repeated-source rule, the eleventh stops the run."""
    from nanguard.core.controller import MAX_FORCED_DROPS

    c = _controller()
    b = FakeBackend(trials=lambda f: (float("nan"),))  # the step fails before any trial update
    for k in range(MAX_FORCED_DROPS):
        s = 20 + 30 * k
        a = c.act(*_event(Cause.LEARNING_RATE_TOO_HIGH, step=s), b, step=s)
        assert a.kind == "drop_batch", k
    with pytest.raises(GiveUpError) as info:
        s = 20 + 30 * MAX_FORCED_DROPS
        c.act(*_event(Cause.LEARNING_RATE_TOO_HIGH, step=s), b, step=s)
    assert "11 steps of this run failed at the healthy weights whatever the fix (learning-rate-too-high)" in str(
        info.value.reason)
    assert c.state.recoveries[-1]["action"] == "give_up"
