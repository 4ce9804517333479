"""Verified recovery on real torch runs: the fix is tried on the failing step before it is
applied, pre-clip evidence, advice that does not repeat the script, the judged outcome and
``nanguard run``'s exit status for it."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

import nanguard
from _spawn import Spawn
from nanguard.core.case import RunContext
from nanguard.core.diagnosis import diagnose
from nanguard.core.finding import Finding
from nanguard.core.history import History, StepRecord
from nanguard.core.taxonomy import Cause


def _regression(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, nn.Module]:
    torch.manual_seed(seed)
    x = torch.randn(1024, 8)
    y = x @ torch.randn(8, 1) + 0.1 * torch.randn(1024, 1)
    return x, y, nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))


def test_lr_far_too_high_is_backed_off_by_a_verified_measured_factor() -> None:
    x, y, model = _regression()
    opt = torch.optim.SGD(model.parameters(), lr=10.0)  # 100× too high
    steps: list[int] = []
    hook = register_optimizer_step_pre_hook(lambda o, a, k: steps.append(1))
    try:
        with nanguard.attach(model, opt, policy="recover") as guard:
            for _ in range(120):
                idx = torch.randint(0, 1024, (64,))
                opt.zero_grad()
                loss = F.mse_loss(model(x[idx]), y[idx])
                loss.backward()
                opt.step()
    finally:
        hook.remove()
    rec = guard.recoveries[0]
    assert rec["action"] == "rollback" and rec["cause"] == "learning-rate-too-high"
    assert rec["verified"] is True and rec["restored_step"] == 0
    t = rec["trials"][0]
    # the update/weight ratio was ~1 (updates as large as the weights): ×0.01 brings it to 1e-2
    assert t["lr_factor"] == 0.01 and t["verified"] and t["lr"] == 0.1 and t["from_step"] == 0
    assert len(t["losses"]) == 4 and t["losses"][-1] < t["losses"][0]
    assert rec["lr_factor"] == 0.01 and guard.recovery_state.lr_scale == 0.01
    assert len(steps) == 120  # the trial's updates fired no optimizer hook of the script's
    _, diag = guard.findings[0]
    assert diag.fixes[0].startswith("lr = 0.1  # verified on the failing step's batch")
    # the trials decide the learning rate: no other (unverified) one is suggested beside it
    assert not any("lr=" in f for f in diag.fixes)
    out = guard.controller.run_ended(guard.step)
    assert out is not None and out["status"] == "recovered"
    assert float(loss) < 0.1


def test_history_keeps_the_norm_from_before_the_scripts_clip() -> None:
    x, y, model = _regression()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with nanguard.attach(model, opt) as guard:
        for _ in range(3):
            opt.zero_grad()
            (1000.0 * F.mse_loss(model(x[:64]), y[:64])).backward()
            total = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
            opt.step()
    last = guard.history[-1]
    assert last.grad_norm == total > 10.0  # what the gradients were
    assert abs((last.clipped_norm or 0.0) - 1.0) < 1e-3  # what the update used
    assert last.to_dict()["clipped_norm"] == last.clipped_norm


def _lr_case(clip: float | None, lr_scale: float = 1.0) -> list[str]:
    h = History()
    for i in range(10):  # |g| 1, lr 50, weights 10·1.5^i: update/weight ratio 5/1.5^i
        h.append(StepRecord(step=i, loss=1.0 + i, grad_norm=1.0, param_norm=10.0 * 1.5**i, lr=50.0))
    f = Finding(phase="forward", op="aten.mse_loss.default", step=10, module="")
    ctx = RunContext(optimizer="SGD", hyper={"lr": 50.0}, clip_norm=clip, lr_scale=lr_scale)
    d = diagnose(f, h, ctx)
    assert d.cause is Cause.LEARNING_RATE_TOO_HIGH
    return d.fixes


def test_lr_advice_is_measured_and_names_the_scripts_own_lr() -> None:
    fixes = _lr_case(None)
    # the median update/weight ratio is 5/1.5^4 ≈ 0.99: ×(1e-2/0.99) → 0.506 → 0.5, not 50/4
    assert "lr=0.5)" in fixes[0] and fixes[0].endswith("# was 50"), fixes[0]
    backed_off = _lr_case(None, lr_scale=0.01)  # the guard already runs it at ×0.01: it passed 5000
    assert backed_off[0].endswith("# was 5e+03")


def test_lr_advice_does_not_repeat_the_scripts_own_clipping() -> None:
    assert any("clip_grad_norm_" in f for f in _lr_case(None))
    assert not any("clip_grad_norm_" in f for f in _lr_case(0.25))  # it clips tighter already


NOT_RECOVERED = """
import torch, torch.nn.functional as F
from torch import nn
torch.manual_seed(0)
x = torch.randn(512, 4); y = x.sum(1, keepdim=True)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(120):
    xb, yb = x[(step * 32) % 512:][:32].clone(), y[(step * 32) % 512:][:32]
    if step == 40:
        xb[3, 1] = float("nan")  # one poisoned sample
    if step > 40:
        yb = yb * 1000.0  # and from then on the targets are on another scale
    opt.zero_grad()
    loss = F.mse_loss(model(xb), yb)
    loss.backward()
    opt.step()
print("final loss", loss.item())
"""


def test_nanguard_run_says_not_recovered_with_exit_status_4(tmp_path: Path, spawn: Spawn) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(NOT_RECOVERED))
    log = tmp_path / "run.json"
    r = spawn.nanguard("run", "--policy", "recover", "--json", str(log), str(script), timeout=300)
    assert r.returncode == 4, r.stderr
    doc = json.loads(log.read_text())
    assert doc["status"] == "not-recovered" and doc["exit_code"] == 4
    assert doc["recoveries"][0]["action"] == "drop_batch" and doc["recoveries"][0]["step"] == 40
    out = doc["outcome"]
    assert out["status"] == "not-recovered" and out["event_step"] == 40 and out["decided_step"] == 90
    assert out["loss_now"] > 1000 * out["loss_before"]
    assert "outcome: NOT recovered" in r.stderr and "had not come back" in r.stderr


def _reinforce(policy_name: str, bad_from: int, steps: int = 12, batch_first: bool = False) -> nanguard.Guard:
    """A REINFORCE-style loop whose returns are computed in Python and made a tensor after the
    forward (or, ``batch_first``, a batch made with torch.tensor before it)."""
    torch.manual_seed(0)
    policy = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
    opt = torch.optim.SGD(policy.parameters(), lr=1e-2)
    guard = nanguard.attach(policy, opt, policy=policy_name)
    try:
        for ep in range(steps):
            rewards = [1.0] * 10
            if ep >= bad_from:
                rewards[4] = -1e308  # discounted, it overflows to -inf
            if batch_first:
                obs = torch.tensor([[r, 0.0, 0.0, 0.0] for r in rewards]) * 1e-308
                returns = torch.ones(10)
            else:
                obs = torch.randn(10, 4)
            logp = torch.log_softmax(policy(obs), -1)[:, 0]
            if not batch_first:
                big, acc = 0.0, []
                for r in reversed(rewards):
                    big = r + 10.0 * big
                    acc.insert(0, big)
                returns = torch.tensor(acc)  # the line that makes it
            loss = -(logp * returns).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        guard.detach()
    return guard


def test_a_tensor_the_script_computed_is_named_at_the_line_that_made_it() -> None:
    import pytest

    with pytest.raises(nanguard.NonFiniteError) as info:
        _reinforce("raise", bad_from=3)
    f, d = info.value.finding, info.value.diagnosis
    assert f.phase == "data" and f.details["origin"] == "computed" and f.step == 3
    assert f.source is not None and f.source.endswith(f":{_line_of('returns = torch.tensor(acc)')}")
    assert d is not None and d.cause is Cause.NONFINITE_INPUT
    assert d.summary.startswith("a tensor the script computed holds")
    assert d.fixes[0].startswith("t = torch.tensor(values, dtype=torch.float64)")
    assert not any("nanguard scan" in fx for fx in d.fixes)


def test_a_batch_made_before_the_forward_is_still_data() -> None:
    import pytest

    with pytest.raises(nanguard.NonFiniteError) as info:
        _reinforce("raise", bad_from=3, batch_first=True)
    assert info.value.finding.details["origin"] == "data"


def test_recover_stops_dropping_computed_returns_after_a_stated_number() -> None:
    import pytest

    with pytest.raises(nanguard.GiveUpError) as info:
        _reinforce("recover", bad_from=3, steps=40)
    err = info.value
    assert err.finding.step == 3 and err.finding.details["origin"] == "computed"
    assert [a.split(": ", 1)[1] for a in err.attempts] == ["drop batch (nonfinite-input)"] * 4 + [
        "give up (nonfinite-input)"]
    assert "5 of the last 5 steps held non-finite values made by the script at" in err.reason


def _line_of(text: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line and "def " not in line)
