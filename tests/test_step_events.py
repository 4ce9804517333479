"""The torch guard under the event orders modern training produces: a GradScaler that skips its
first steps, closures (LBFGS), a swallowed exception, two optimizers, ``state_dict``, and a
script's own ``attach()`` under ``nanguard run``. Faults are injected deterministically and the
exact op, phase, cause and decision are asserted."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nanguard
from _spawn import Spawn
from nanguard import Cause, NonFiniteError


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))


def test_gradscaler_skips_before_the_first_optimizer_step_are_not_failures() -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24)
    x, y = torch.randn(32, 16), torch.randn(32, 1)
    with nanguard.attach(model) as guard:  # no optimizer given: backward() marks steps at first
        for _ in range(30):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                out = model(x)
            loss = F.mse_loss(out.float(), y)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
    events = [r.event for r in guard.history]
    assert guard.findings == [] and events[0] == "scaler-skip"
    assert "scaler-skip" in events and events[-1] is None  # it found its scale, then stepped
    assert guard.step == 30 and all(math.isfinite(float(p.sum())) for p in model.parameters())


def test_gradscaler_cannot_save_a_nan_loss_mid_run() -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    x, y = torch.randn(32, 16), torch.randn(32, 1)
    with pytest.raises(NonFiniteError) as info, nanguard.attach(model, opt):
        for step in range(6):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                out = model(x)
            loss = F.mse_loss(out.float(), y)
            if step == 4:
                loss = loss * torch.log(torch.zeros(()))  * 0  # 0 * -inf = NaN in the loss code
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    f, d = info.value.finding, info.value.diagnosis
    assert f.step == 4 and f.op == "aten.log.default" and f.phase == "forward"
    assert d is not None and d.cause is Cause.UNSAFE_OP


def test_lbfgs_closure_is_checked_after_it_ran() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
    x, y = torch.randn(64, 4), torch.randn(64, 1)
    with pytest.raises(NonFiniteError) as info, nanguard.attach(model, opt):
        for step in range(6):
            def closure(zero: bool = step == 3) -> torch.Tensor:
                opt.zero_grad()
                out = model(x)
                denom = out.abs().sum() * (0.0 if zero else 1.0)
                loss = F.mse_loss(out, y) / denom
                loss.backward()
                return loss

            opt.step(closure)
    f, d = info.value.finding, info.value.diagnosis
    assert (f.op, f.phase, f.step) == ("aten.div.Tensor", "forward", 3)
    assert d is not None and d.cause is Cause.UNSAFE_OP


def test_a_swallowed_error_leaves_nothing_stale() -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    caught, applied = [], 0
    with nanguard.attach(model, opt) as guard:
        for step in range(8):
            x, y = torch.randn(16, 16), torch.randn(16, 1)
            if step == 1:
                x[3, 2] = float("nan")
            before = model[0].weight.detach().clone()
            try:
                opt.zero_grad()
                F.mse_loss(model(x), y).backward()
                opt.step()
            except NonFiniteError as err:
                caught.append(err.finding.step)
                continue
            applied += not torch.equal(before, model[0].weight)
    assert caught == [1] and applied == 7  # every later (finite) update was applied
    assert len(guard.findings) == 1 and guard.findings[0][1].cause is Cause.NONFINITE_INPUT
    got = guard.controller.swallowed()
    assert got is not None and got[2] == 1 and guard.step == 8


def test_two_optimizers_each_count_a_step_and_the_failing_one_is_numbered() -> None:
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    D = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 1))
    og, od = torch.optim.Adam(G.parameters(), 1e-3), torch.optim.Adam(D.parameters(), 1e-3)
    with pytest.raises(NonFiniteError) as info, nanguard.attach() as guard:
        for it in range(10):
            fake = G(torch.randn(32, 4))
            od.zero_grad()
            (F.softplus(-D(torch.randn(32, 2) + 3)).mean() + F.softplus(D(fake.detach())).mean()).backward()
            od.step()
            og.zero_grad()
            s = torch.sigmoid(D(fake)) * (0.0 if it == 7 else 1.0)
            (-torch.log(s).mean()).backward()
            og.step()
    f = info.value.finding
    assert f.op == "aten.log.default" and f.step == 2 * 7 + 1  # D, G, D, G, ...: G's 8th step
    names = [r.optimizer for r in guard.history]
    assert names[:4] == ["Adam[0]", "Adam[1]", "Adam[0]", "Adam[1]"]
    assert len(guard.history.of("Adam[1]")) == 8


def test_state_dict_keeps_a_back_off_across_a_resume(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=30.0)
    x = torch.randn(64, 8) * 10
    y = x.sum(1, keepdim=True)
    guard = nanguard.attach(model, opt, policy="recover")
    try:
        for _ in range(40):
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
    finally:
        guard.detach()
    assert guard.recoveries and (guard.recovery_state.lr_scale < 1.0 or guard.recovery_state.clip_norm is not None)
    torch.save({"nanguard": guard.state_dict()}, tmp_path / "ckpt.pt")
    state = torch.load(tmp_path / "ckpt.pt", weights_only=True)["nanguard"]  # plain values only
    resumed = nanguard.attach(model, opt, policy="recover")
    try:
        resumed.load_state_dict(state)
        assert resumed.recovery_state.lr_scale == guard.recovery_state.lr_scale
        assert resumed.recovery_state.clip_norm == guard.recovery_state.clip_norm
        assert resumed.recoveries == guard.recoveries and resumed.step == guard.step
    finally:
        resumed.detach()


_SCRIPT_WITH_ITS_OWN_GUARD = """
import json, torch, torch.nn as nn, torch.nn.functional as F, nanguard
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=30.0)
g = nanguard.attach(model, opt, policy="recover")
x = torch.randn(64, 8) * 10
y = x.sum(1, keepdim=True)
for _ in range(40):
    opt.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
print(json.dumps({"lr_scale": g.recovery_state.lr_scale, "loss": loss.item(),
                  "recoveries": [r["action"] for r in g.recoveries]}))
"""


def test_a_scripts_own_attach_adopts_the_guard_of_nanguard_run(tmp_path: Path, spawn: Spawn) -> None:
    script = tmp_path / "own_guard.py"
    script.write_text(textwrap.dedent(_SCRIPT_WITH_ITS_OWN_GUARD))
    plain = spawn.python(str(script), timeout=300)
    under = spawn.nanguard("run", "--policy", "raise", "--json", str(tmp_path / "run.json"), str(script),
                           timeout=300)
    assert plain.returncode == 0, plain.stderr
    assert under.returncode == 0, under.stderr
    # one guard acted: the back-off and the result are those of the script's guard alone
    assert json.loads(under.stdout) == json.loads(plain.stdout)
    assert "adopts the guard of `nanguard run`" in under.stderr and "'recover'" in under.stderr
    log = json.loads((tmp_path / "run.json").read_text())
    assert [r["action"] for r in log["recoveries"]] == json.loads(plain.stdout)["recoveries"]


_SWALLOWING_SCRIPT = """
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
ok = 0
for step in range(12):
    try:
        x, y = torch.randn(16, 4), torch.randn(16, 1)
        if step == 2:
            x[3, 1] = float("nan")
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
        ok += 1
    except Exception:
        continue
print("applied", ok)
"""


def test_adopting_the_run_guard_keeps_its_counters_and_back_off() -> None:
    """A script's own ``attach()`` under ``nanguard run`` replaces the configuration only: what
    the run went through before (counters, recoveries, a back-off) stays the run's."""
    from nanguard.torch.session import TorchSession

    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 16), torch.randn(32, 1)
    session = TorchSession(policy="skip")
    session.install()
    try:
        guard = session.guard
        for step in range(3):
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            if step == 1:
                model[0].weight.grad[0, 0] = float("nan")  # one bad step: skipped
            opt.step()
        assert guard.total_notfinite == 1 and len(guard.recoveries) == 1
        guard.controller.state = guard.recovery_state.applied(0.25, None)  # a back-off in force
        with _quiet():
            adopted = nanguard.attach(model, opt, policy="recover", max_recoveries=3)
        assert adopted is guard and guard.policy == "recover"
        assert guard.controller.config.max_recoveries == 3
        assert guard.total_notfinite == 1 and len(guard.recoveries) == 1
        assert guard.recovery_state.lr_scale == 0.25
    finally:
        session.uninstall()


def _quiet() -> Any:
    import contextlib
    import io

    return contextlib.redirect_stderr(io.StringIO())


def test_nanguard_run_reports_a_finding_the_script_swallowed(tmp_path: Path, spawn: Spawn) -> None:
    script = tmp_path / "swallow.py"
    script.write_text(textwrap.dedent(_SWALLOWING_SCRIPT))
    out = spawn.nanguard("run", "--json", str(tmp_path / "r.json"), str(script), timeout=300)
    assert out.returncode == 3, out.stderr
    assert out.stdout.strip() == "applied 11"  # the later steps ran and were applied
    assert "made in the input data at step 2" in out.stderr or "step 2" in out.stderr
    assert "caught nanguard's error at step 2" in out.stderr
    log = json.loads((tmp_path / "r.json").read_text())
    assert log["status"] == "nonfinite" and log["exit_code"] == 3
    assert [e["step"] for e in log["events"]] == [2] and log["events"][0]["cause"] == "nonfinite-input"


class _ReluLM(nn.Module):
    def __init__(self, vocab: int = 50, hidden: int = 64) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden)
        self.rnn = nn.RNN(hidden, hidden, nonlinearity="relu", batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y, h = self.rnn(self.emb(x), h)
        return self.out(y), h


def test_state_carried_across_steps_is_not_data_and_recover_stops_on_the_first_event() -> None:
    torch.manual_seed(0)
    model = _ReluLM()
    opt = torch.optim.SGD(model.parameters(), lr=40.0)  # blows up at step 3
    data = torch.randint(0, 50, (8, 2000))
    hidden = torch.zeros(1, 8, 64)
    with pytest.raises(nanguard.GiveUpError) as info, nanguard.attach(model, opt, policy="recover") as g:
        for i in range(30):
            x, y = data[:, i * 20:(i + 1) * 20], data[:, i * 20 + 1:(i + 1) * 20 + 1]
            hidden = hidden.detach()  # carried from batch to batch: a rollback cannot reset it
            opt.zero_grad()
            logits, hidden = model(x, hidden)
            F.cross_entropy(logits.reshape(-1, 50), y.reshape(-1)).backward()
            opt.step()
    err = info.value
    first, last = err.finding, err.last
    assert (first.step, first.op, first.module) == (3, "aten.mm.default", "rnn")  # leads with the first
    assert err.diagnosis is not None and err.diagnosis.cause is Cause.LEARNING_RATE_TOO_HIGH
    # at step 3 every fix was tried from the healthy snapshot of step 0 — with the hidden state the
    # script passed in, already huge — and none helped: the batch's step was skipped, not "fixed"
    trials = err.diagnosis.trials
    assert [t["lr_factor"] for t in trials] == [0.01, 0.001, 0.0001, 1e-06, 1e-08, 1e-10]
    assert not any(t["verified"] for t in trials)
    assert all(t["from_step"] == 0 and t["losses"][0] > 1e20 for t in trials)
    assert "state the script carries across steps" in g.recoveries[0]["reason"]
    # at step 4 the state itself is non-finite: carried, not data, and recover stops at once
    assert last is not None and last[0].step == 4 and last[0].details["origin"] == "carried"
    assert last[1] is not None and last[1].cause is Cause.LEARNING_RATE_TOO_HIGH  # not nonfinite-input
    assert [r["action"] for r in g.recoveries] == ["drop_batch", "give_up"]
    assert "carries across steps" in err.reason


def test_clip_grad_norm_is_one_event_on_the_tape_and_no_gradient_is_copied() -> None:
    # clip_grad_norm_ at every step: one event (get_total_norm, what a replay re-runs on its own
    # gradients), not its ~9 ops with a copy of every gradient its in-place scaling overwrote
    from nanguard.torch._recorder import TapeOp
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    with nanguard.attach(model, opt) as g:
        for _ in range(2):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            total = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
            ops = [ev for ev in g.recorder.events if isinstance(ev, TapeOp)]
            opt.step()
    assert len(ops) == 2 and ops[0].func.__name__ == "cross_entropy"
    assert ops[1].func is torch.nn.utils.get_total_norm
    grads, = ops[1].args
    assert all(a is p.grad for a, p in zip(grads, model.parameters()))  # the gradients themselves
    assert float(total) > 0.01 and all(float(p.grad.norm()) < 0.0101 for p in model.parameters())


def test_an_in_place_op_on_the_gradients_keeps_no_copy_of_them() -> None:
    # a hand-written rescale of every gradient after backward(): the event names the gradients
    # (a replay gives it the ones its backward made), and keeps no copy of what it overwrote
    from nanguard.torch._recorder import TapeOp
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    batch_copy = x.clone()
    with nanguard.attach(model, opt) as g:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        grads = [p.grad for p in model.parameters()]
        torch._foreach_mul_(grads, 0.5)
        x.mul_(2.0)  # an in-place op on the batch (from outside the step): its copy is kept
        (mul_g, mul_x) = [ev for ev in g.recorder.events if isinstance(ev, TapeOp)][-2:]
        opt.step()
    assert all(a is b for a, b in zip(mul_g.args[0], grads))
    assert mul_x.args[0] is not x and torch.equal(mul_x.args[0], batch_copy)
