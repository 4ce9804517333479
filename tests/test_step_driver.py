"""The step protocol on its own: the framework-free StepDriver over a fake port, the torch step
object's moves, the recorder's hold/release, and the actuator and replayer built alone."""

from __future__ import annotations

from typing import Any

import pytest

from nanguard.core.case import RunContext
from nanguard.core.diagnosis import Diagnosis
from nanguard.core.errors import NonFiniteError
from nanguard.core.finding import Finding
from nanguard.core.handle import GuardOptions
from nanguard.core.history import History
from nanguard.core.step import Reading, Stage, StepDriver, StepOrderError
from nanguard.core.trials import Fix, Trial


class FakePort:
    """Every request of the driver, logged; a finding of the loss when asked to locate."""

    eps: float | None = None
    adaptive = False
    script_clip: float | None = None

    def __init__(self, ok_ranks: bool = True, bad_ranks: list[int] | None = None) -> None:
        self.calls: list[str] = []
        self._agree = ok_ranks
        self._bad = bad_ranks or []
        self.history_ = History()

    def agree(self, ok: bool) -> tuple[bool, list[int]]:
        self.calls.append("agree")
        return (ok and self._agree), ([] if ok and self._agree else (self._bad or [0]))

    def locate(self) -> Finding:
        self.calls.append("locate")
        return Finding(phase="forward", op="aten.log.default", reached="loss", detected_by="replay")

    def history(self) -> History:
        return self.history_

    def context(self) -> RunContext:
        return RunContext()

    def share(self, finding: Finding | None, diag: Diagnosis | None,
              bad_ranks: list[int]) -> tuple[Finding, Diagnosis]:
        self.calls.append("share")
        assert finding is not None and diag is not None
        return finding, diag

    def snapshot(self, before_update: bool) -> None:
        self.calls.append(f"snapshot({before_update})")

    def apply_settings(self, lr_scale: float, clip_norm: float | None) -> None:
        self.calls.append(f"settings({lr_scale})")

    def skip_update(self) -> None:
        self.calls.append("skip_update")

    def rollback(self, older: bool = False) -> int | None:
        self.calls.append("rollback")
        return None

    def trial(self, fixes: list[Fix]) -> list[Trial] | None:
        self.calls.append("trial")
        return None

    def across_ranks(self, values: tuple[float | None, ...]) -> list[tuple[float | None, ...]]:
        return [values]

    def settings_changed(self) -> None:
        self.calls.append("settings_changed")

    def set_eps(self, eps: float) -> None:
        self.calls.append("set_eps")

    def restore_state(self) -> dict[str, Any]:
        return {}


def _driver(policy: str = "raise") -> StepDriver:
    return StepDriver(GuardOptions(policy=policy).controller())


def test_a_healthy_step_is_agreed_snapshotted_given_its_settings_and_recorded() -> None:
    d, port = _driver(), FakePort()
    ended: list[int] = []
    d.on_end.append(lambda: ended.append(d.step))
    assert d.check(True, port, checks_after=False)
    assert port.calls == ["agree", "snapshot(True)", "settings(1.0)"]
    rec = d.end(Reading(finite=True, loss=0.5, grad_norm=1.0, lr=0.1, opt_type="SGD", num_params=4))
    assert (rec.step, rec.loss, rec.finite, rec.skipped, rec.event) == (0, 0.5, True, False, None)
    assert rec.update_norm == pytest.approx(0.1) and d.stage is Stage.ENDED and ended == [1]


def test_a_failed_step_is_located_diagnosed_shared_and_raised_under_raise() -> None:
    d, port = _driver(), FakePort()
    with pytest.raises(NonFiniteError) as info:
        d.check(False, port, checks_after=False)
    assert port.calls == ["agree", "locate", "share"]
    assert info.value.finding.op == "aten.log.default" and d.skipped and d.event == "nonfinite"
    rec = d.end(Reading(finite=False), finite=False)
    assert (rec.finite, rec.skipped, rec.event) == (False, True, "nonfinite")
    assert len(d.controller.findings) == 1 and d.controller.raised


def test_under_skip_the_update_is_skipped_and_counted() -> None:
    d, port = _driver("skip"), FakePort()
    assert not d.check(False, port, checks_after=True)
    assert port.calls[-1] == "skip_update" and d.event == "skip"
    assert d.controller.state.notfinite_count == 1
    d.end(Reading(finite=False))
    assert d.check(True, port, checks_after=True)  # counted healthy only after the update
    assert d.controller.state.notfinite_count == 1
    assert d.check_after(True, port, lambda: pytest.fail("no finding for a healthy update"))
    assert d.controller.state.notfinite_count == 0 and port.calls[-1] == "snapshot(False)"


def test_a_rank_that_saw_nothing_takes_the_shared_finding_without_locating() -> None:
    d, port = _driver("skip"), FakePort(ok_ranks=False, bad_ranks=[1])
    shared: list[Any] = []

    def share(finding: Any, diag: Any, bad: list[int]) -> tuple[Finding, Diagnosis]:
        shared.append((finding, bad))
        f = Finding(phase="data", op="input", detected_by="replay")
        return f, Diagnosis.from_dict({"cause": "nonfinite-input", "confidence": 1.0, "summary": "x"})

    port.share = share  # type: ignore[method-assign]
    d.check(True, port, checks_after=False)  # this rank is fine; rank 1 is not
    assert "locate" not in port.calls and shared == [(None, [1])] and d.skipped


def test_an_event_out_of_order_is_an_error_of_ours() -> None:
    d, port = _driver(), FakePort()
    with pytest.raises(StepOrderError, match="an error inside nanguard"):
        d.check_after(True, port, lambda: pytest.fail("unreachable"))  # no step is open


def test_the_step_object_refuses_an_impossible_move() -> None:
    from nanguard.torch._step import TorchStep, Where

    st = TorchStep()
    st.enter(Where.OPTIMIZER)
    st.enter(Where.CLOSURE)
    with pytest.raises(StepOrderError):
        st.enter(Where.OUTSIDE)  # out of a closure without going back through the optimizer
    st.enter(Where.OPTIMIZER)
    st.enter(Where.OUTSIDE)
    st.reset()
    assert st.where is Where.OUTSIDE and st.check is None and not st.losses


def test_the_recorder_raises_on_a_release_without_a_hold() -> None:
    from nanguard.torch._modules import ModuleStack
    from nanguard.torch._recorder import StepRecorder

    rec = StepRecorder(ModuleStack(None))
    rec.hold()
    rec.release()
    with pytest.raises(StepOrderError):
        rec.release()


def test_the_actuator_alone_hides_and_gives_back_the_gradients_and_the_back_off() -> None:
    import torch

    from nanguard.core.policy import RecoveryState
    from nanguard.torch._backend import Actuator
    from nanguard.torch._modules import ModuleStack
    from nanguard.torch._watched import WatchSet
    from nanguard.torch.snapshot import Snapshotter

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    controller = GuardOptions(policy="recover").controller()
    watch = WatchSet(model, ModuleStack(model))
    watch.primary = opt
    act = Actuator(controller, watch, Snapshotter(every=1))
    model(torch.ones(1, 2)).sum().backward()
    params = list(model.parameters())
    grads = [p.grad for p in params]
    act.skip_update(params, opt)
    assert all(p.grad is None for p in params)
    controller.state = RecoveryState(lr_scale=0.5)
    act.apply_settings(params, opt, total_norm=None)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)
    act.give_back()
    assert [p.grad for p in params] == grads and opt.param_groups[0]["lr"] == pytest.approx(0.1)
    act.maybe_snapshot(0, before_update=True)
    assert act.snapshots.last is not None and act.rollback() == 0


def test_the_replayer_alone_names_the_op_of_a_recorded_step() -> None:
    import torch

    from nanguard.torch._modules import ModuleStack
    from nanguard.torch._recorder import StepRecorder
    from nanguard.torch._watched import WatchSet
    from nanguard.torch.replay import Replayer
    from nanguard.torch.watch import check

    class LogNet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.log(self.fc(x) * 0)

    model = LogNet()
    modules = ModuleStack(model)
    rec = StepRecorder(modules)
    controller = GuardOptions().controller()
    replayer = Replayer(model, modules, rec, WatchSet(model, modules), controller)
    rec.resume_tape = True
    modules.on_root_enter, modules.on_root_exit = rec.root_enter, rec.root_exit
    modules.install(roots_only=True)
    try:
        loss = model(torch.ones(2, 3)).sum()
        rec.backward("backward", [loss], [], None)
        loss.backward()
    finally:
        modules.remove()
    params = list(model.parameters())
    chk, _ = check([p.grad for p in params], [loss.detach()], [])
    f = replayer.locate(chk, params, step=0, sinks=[])
    assert (f.op, f.phase, f.module, f.detected_by) == ("aten.log.default", "forward", "", "replay")  # in the model itself


def test_the_weights_are_counted_again_once_the_optimizer_is_known() -> None:
    """Counted at the first backward from the graph leaves (none left where FSDP2 freed them),
    the count stayed 0 for the run, and Adam's update was sized as SGD's (lr·|g|: "1e+05× the
    weights" at lr 3, where each update moved them about 1×)."""
    import torch

    from nanguard.torch._modules import ModuleStack
    from nanguard.torch._watched import WatchSet

    model = torch.nn.Linear(4, 3)
    watch = WatchSet(model, ModuleStack(model))
    watch.leaves = []  # the leaves of the first backward, freed
    assert watch.num_params() == 0
    watch.primary = torch.optim.Adam(model.parameters())
    assert watch.num_params() == 15
