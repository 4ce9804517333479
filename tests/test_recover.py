"""Recovery policies: no non-finite update reaches the weights; rollbacks are exact."""

from __future__ import annotations

import math
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.optimizer import (
    register_optimizer_step_pre_hook,
)

import nanguard
from nanguard import Cause
from nanguard.core.diagnosis import Diagnosis
from nanguard.core.policy import RecoveryConfig, RecoveryState, backoff, decide
from nanguard.demos import seed_torch


def _finite_state(model: nn.Module, opt: torch.optim.Optimizer) -> bool:
    ts = list(model.parameters())
    for st in opt.state.values():
        ts += [v for v in st.values() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    return all(bool(torch.isfinite(t).all()) for t in ts)


# --- the policy state machine, with plain values ---------------------------------------------


def _diag(cause: Cause) -> Diagnosis:
    return Diagnosis(cause, 0.9, "test")


def test_policy_decisions_by_cause() -> None:
    cfg, st = RecoveryConfig(policy="recover"), RecoveryState()
    assert decide(cfg, st, _diag(Cause.NONFINITE_INPUT), 3)[0].kind == "drop_batch"
    assert decide(cfg, st, _diag(Cause.UNSAFE_OP), 3)[0].kind == "raise"
    assert decide(cfg, st, _diag(Cause.BAD_INITIALIZATION), 3)[0].kind == "raise"
    a, st2 = decide(cfg, st, _diag(Cause.LEARNING_RATE_TOO_HIGH), 5)
    assert (a.kind, a.lr_factor, a.clip_norm) == ("rollback", 0.5, None)
    a, _ = decide(cfg, st2, _diag(Cause.EXPLODING_GRADIENTS), 6, clip_suggestion=2.0)
    assert (a.kind, a.clip_norm) == ("rollback", 2.0)
    assert decide(RecoveryConfig(policy="recover", on_unfixable="skip"), st,
                  _diag(Cause.UNSAFE_OP), 1)[0].kind == "skip"
    assert decide(RecoveryConfig(policy="skip"), st, _diag(Cause.LEARNING_RATE_TOO_HIGH), 1)[0].kind == "skip"


def test_decide_is_pure_counts_in_the_new_state_and_applies_nothing() -> None:
    cfg, st = RecoveryConfig(policy="recover"), RecoveryState()
    a, st2 = decide(cfg, st, _diag(Cause.LEARNING_RATE_TOO_HIGH), 5)
    assert st == RecoveryState()  # the state given is never changed
    assert (st2.notfinite_count, st2.total_notfinite) == (1, 1)
    assert st2.lr_scale == 1.0 and st2.clip_norm is None  # the back-off joins when carried out
    applied = st2.applied(a.lr_factor, a.clip_norm)
    assert applied.lr_scale == 0.5 and applied.healthy().notfinite_count == 0
    assert applied.healthy().total_notfinite == 1


def test_backoff_is_sized_by_the_update_ratio() -> None:
    cfg = RecoveryConfig(policy="recover")
    assert backoff(cfg, None) == 0.5 and backoff(cfg, 1e-3) == 0.5
    assert backoff(cfg, 1.0) == 0.01  # updates as large as the weights: ×0.01
    assert backoff(cfg, 0.1) == pytest.approx(0.1)


def test_recoveries_are_bounded_per_window() -> None:
    cfg, st = RecoveryConfig(policy="recover", max_recoveries=2, window=100), RecoveryState()
    for step in (1, 2):
        act, st = decide(cfg, st, _diag(Cause.LEARNING_RATE_TOO_HIGH), step)
        st = st.recorded(step, act)
    assert decide(cfg, st, _diag(Cause.LEARNING_RATE_TOO_HIGH), 3)[0].kind == "give_up"
    assert decide(cfg, st, _diag(Cause.LEARNING_RATE_TOO_HIGH), 500)[0].kind == "rollback"  # window passed


def test_invalid_policy_arguments() -> None:
    with pytest.raises(ValueError, match="valid policies"):
        RecoveryConfig(policy="retry")
    with pytest.raises(ValueError, match="lr_factor"):
        RecoveryConfig(policy="recover", lr_factor=2.0)


# --- torch ---------------------------------------------------------------------------------------


def test_seed_demo_recovers_and_finishes() -> None:
    guard, losses = seed_torch.train(seed_torch.LR, steps=200, policy="recover")
    assert len(guard.recoveries) >= 1
    r = guard.recoveries[0]
    assert r["action"] == "rollback" and r["cause"] == "learning-rate-too-high"
    assert r["restored_step"] == 0 and r["lr_factor"] < 0.5
    tail = losses[-50:]
    assert all(math.isfinite(v) for v in tail)
    assert sum(tail) / len(tail) < losses[0]


def _mlp() -> nn.Module:
    return nn.Sequential(OrderedDict(fc1=nn.Linear(8, 16), relu=nn.ReLU(), fc2=nn.Linear(16, 1)))


def test_rollback_restores_the_snapshot_bit_for_bit_and_then_uses_the_new_lr() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(fc=nn.Linear(8, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=100, gamma=0.5)
    x = torch.randn(64, 8) * 30.0  # curvature ~1800: lr 0.1 diverges ~x180 per step
    y = torch.randn(64, 1)
    applied: list[float] = []
    with nanguard.attach(model, opt, policy="recover", snapshot_every=3) as guard:
        hook = register_optimizer_step_pre_hook(lambda o, a, k: applied.append(o.param_groups[0]["lr"]))
        snaps: dict[int, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        for _ in range(30):
            snap = guard.snapshots.last
            if snap is not None and snap.step not in snaps:
                state = snap.optimizers[0]["state"].get(0, {})
                snaps[snap.step] = ([t.clone() for t in snap.params], [
                    t.clone() for t in state.values() if isinstance(t, torch.Tensor)
                ])
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
            if guard.recoveries and len(applied) and "checked" not in snaps:
                snaps["checked"] = ([], [])  # type: ignore[index]
                rec = guard.recoveries[0]
                params, mom = snaps[rec["restored_step"]]
                assert all(torch.equal(a, b) for a, b in zip(params, model.parameters()))
                if mom:
                    assert torch.equal(mom[0], opt.state[model.fc.weight]["momentum_buffer"])
                fail_step = rec["step"]
            sched.step()
        hook.remove()
    assert [r["action"] for r in guard.recoveries][:1] == ["rollback"]
    rec = guard.recoveries[0]
    # it diverged from its first update (×180 per step): the snapshots taken since were of a
    # run already off the rails, so none of them was kept as "last known good"
    assert rec["cause"] == "learning-rate-too-high" and rec["restored_step"] == 0
    assert rec["steps_lost"] == rec["step"] - rec["restored_step"]
    scale = guard.recovery_state.lr_scale
    assert scale <= 0.5
    # the user's lr is untouched; the guard applies its factor inside each step
    assert opt.param_groups[0]["lr"] == 0.1
    assert applied[fail_step + 1 :] and all(v == pytest.approx(0.1 * scale) for v in applied[fail_step + 1 :])
    assert _finite_state(model, opt)


def test_hand_written_lr_schedule_keeps_the_backoff() -> None:
    """Scripts that assign param_group['lr'] every step must not undo a back-off."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    applied: list[float] = []
    hook = register_optimizer_step_pre_hook(
        lambda o, a, k: applied.append(o.param_groups[0]["lr"])
    )
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    with nanguard.attach(model, opt, policy="recover") as guard:
        guard.controller.state = RecoveryState(lr_scale=0.25)  # as after two halvings
        for step in range(3):
            for g in opt.param_groups:
                g["lr"] = 0.1 * (step + 1)  # warmup written by hand
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
    hook.remove()
    # pre-hooks run in registration order: ours saw the user's value, the guard scaled it after
    assert applied == [pytest.approx(0.1), pytest.approx(0.2), pytest.approx(0.3)]
    assert [r.lr for r in guard.history] == [pytest.approx(0.025), pytest.approx(0.05), pytest.approx(0.075)]


def test_skip_and_recover_never_leave_nonfinite_weights_or_optimizer_state() -> None:
    for policy in ("skip", "recover"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        data = torch.randn(20, 16, 8)
        data[2::5, 3, 1] = float("nan")
        with nanguard.attach(model, opt, policy=policy, max_consecutive_skips=50):
            for step in range(20):
                x = data[step]
                opt.zero_grad(set_to_none=True)
                F.mse_loss(model(x), x[:, :1]).backward()
                opt.step()
                assert _finite_state(model, opt), (policy, step)
                assert all(bool(torch.isfinite(b).all()) for b in model.buffers()), (policy, step)


def test_nonfinite_input_drops_the_batch_and_logs_the_samples() -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randn(4, 8, 8)
    data[1, 2, 5] = float("inf")
    data[1, 6, 0] = float("nan")
    with nanguard.attach(model, opt, policy="recover") as guard:
        for step in range(4):
            x = data[step]
            opt.zero_grad()
            F.mse_loss(model(x), torch.zeros(8, 1)).backward()
            opt.step()
    (rec,) = guard.recoveries
    assert rec["action"] == "drop_batch" and rec["step"] == 1 and rec["samples"] == [2, 6]


def test_unfixable_cause_stops_under_recover() -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(nanguard.NonFiniteError) as info, nanguard.attach(model, opt, policy="recover"):
        opt.zero_grad()
        torch.log(model(torch.randn(4, 8)) * 0).sum().backward()  # log(0)
        opt.step()
    assert info.value.diagnosis.cause is Cause.UNSAFE_OP


def test_optimizer_state_rolls_back_and_sets_eps() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(fc=nn.Linear(4, 2)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=0.0)
    x = torch.randn(8, 4)
    x[:, 0] = 0.0  # a gradient column of exact zeros: Adam's update is 0/0
    with nanguard.attach(model, opt, policy="recover") as guard:
        for _ in range(5):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
            assert _finite_state(model, opt)
    assert guard.recoveries[0]["cause"] == "optimizer-state"
    assert opt.param_groups[0]["eps"] == 1e-8


def test_grad_scaler_skips_are_not_failures() -> None:
    torch.manual_seed(0)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127)  # overflows at first: the scaler backs off
    with nanguard.attach(model, opt, policy="raise") as guard:
        for _ in range(8):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.mse_loss(model(torch.randn(8, 8)), torch.full((8, 1), 10.0))
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    assert guard.findings == []
    assert any(r.event == "scaler-skip" for r in guard.history)
    assert scaler.get_scale() < 2.0**127


def test_grad_scaler_may_halve_its_scale_many_times_before_it_is_a_failure() -> None:
    # scaled gradients overflow float32 until the scale is below ~2**93: 30+ skips in a row
    torch.manual_seed(0)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=1e-12)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127)
    with nanguard.attach(model, opt, policy="raise") as guard:
        for _ in range(45):
            opt.zero_grad()
            loss = F.mse_loss(model(torch.randn(8, 8)), torch.full((8, 1), 1e10))
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    skips = sum(1 for r in guard.history if r.event == "scaler-skip")
    assert guard.findings == [] and skips > guard.controller.config.max_consecutive_skips
    assert 1.0 < scaler.get_scale() < 2.0**100


def test_grad_scaler_cannot_save_a_loss_that_overflows_unscaled() -> None:
    # the loss itself is +inf (a forward overflow): no scale can fix that, so it is a failure at
    # once, at its op — not after the scaler halved its way down to 1 (the scale's own
    # exhaustion is tested over the controller, tests/test_controller.py)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4)
    x = torch.randn(8, 8)
    with pytest.raises(nanguard.NonFiniteError) as info, nanguard.attach(model, opt) as guard:
        for _ in range(10):
            opt.zero_grad()
            loss = (model(x) * 1e25).pow(2).mean()  # +inf in float32 at any scale, never NaN
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    f = info.value.finding
    assert (f.step, f.op, f.phase) == (0, "aten.pow.Tensor_Scalar", "forward")
    assert f.details["note"] == "the loss itself is not finite: no loss scale can fix it"
    assert [r.event for r in guard.history] == ["nonfinite"]


def test_grad_scaler_with_a_nan_loss_is_a_failure() -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    x = torch.randn(8, 8)
    x[0, 0] = float("nan")
    with pytest.raises(nanguard.NonFiniteError) as info, nanguard.attach(model, opt):
        opt.zero_grad()
        scaler.scale(F.mse_loss(model(x), torch.zeros(8, 1))).backward()
        scaler.step(opt)
    assert info.value.finding.phase == "data"


def test_gradient_accumulation_is_checked_at_the_real_step() -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(2, 4, 4, 8)  # steps x micro-batches x samples x features
    data[1, 2, 1, 1] = float("nan")
    with pytest.raises(nanguard.NonFiniteError) as info, nanguard.attach(model, opt) as guard:
        for step in range(2):
            opt.zero_grad()
            for micro in range(4):
                (F.mse_loss(model(data[step, micro]), torch.zeros(4, 1)) / 4).backward()
            opt.step()
    assert info.value.finding.phase == "data" and info.value.finding.step == 1
    # the step that raised is over (a script that catches the error starts clean at step 2)
    assert guard.step == 2 and guard.backward_calls == 8


def _train(policy: str) -> list[torch.Tensor]:
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 10)
    g = nanguard.attach(model, opt, policy=policy, snapshot_every=3) if policy else None
    try:
        for _ in range(10):
            opt.zero_grad(set_to_none=True)
            x = torch.randn(16, 8)
            F.smooth_l1_loss(model(x), x[:, :1]).backward()
            opt.step()
            sched.step()
    finally:
        if g is not None:
            g.detach()
    return [t.detach().clone() for t in [*model.parameters(), *model.buffers()]]


def test_healthy_run_under_recover_is_bit_for_bit_unchanged() -> None:
    plain = _train("")
    assert all(torch.equal(a, b) for a, b in zip(plain, _train("recover")))


def test_snapshot_to_disk_is_read_back_safely_and_bit_for_bit(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from nanguard.torch.snapshot import Snapshotter, module_buffers

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)
    model(torch.randn(8, 4)).sum().backward()
    opt.step()
    sched.step()
    snaps = Snapshotter(every=1, directory=str(tmp_path))
    snap = snaps.take(1, list(model.parameters()), module_buffers([model]), [opt], [sched], [])
    assert snap.path is not None and snap.nbytes > 0
    before = [t.clone() for t in [*model.parameters(), *model.buffers()]]
    state_before = {k: v.clone() for k, v in opt.state[next(model.parameters())].items()}
    for _ in range(3):  # move everything on
        model(torch.randn(8, 4)).sum().backward()
        opt.step()
        sched.step()
    loaded = snaps.load(snap.path)  # torch.load(weights_only=True): no pickled code runs
    Snapshotter.restore(loaded, list(model.parameters()), module_buffers([model]), [opt], [sched], [])
    assert all(torch.equal(a, b) for a, b in zip(before, [*model.parameters(), *model.buffers()]))
    st = opt.state[next(model.parameters())]
    assert all(torch.equal(state_before[k], st[k]) for k in state_before)
    assert sched.last_epoch == 1 and opt.param_groups[0]["lr"] == pytest.approx(5e-3)
