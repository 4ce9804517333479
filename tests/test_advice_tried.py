"""The default mode's advice is tried before it is shown (issue: cure the cause, in every mode).

Under policy ``raise`` nothing is recovered, yet the fixes ``recover`` would try are run on the
failing step from a snapshot (kept while affordable): the learning rate that trained is the one
suggested, said so; one that did not is never shown as working; the run is left as it failed.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nanguard
from nanguard.core.case import RunContext
from nanguard.core.diagnosis import diagnose
from nanguard.core.errors import NonFiniteError
from nanguard.core.finding import Finding
from nanguard.core.history import History, StepRecord
from nanguard.core.snapbudget import SnapshotBudget
from nanguard.core.taxonomy import Cause
from nanguard.core.trials import Fix, Trial


def _unscaled(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw features up to 1000 and targets in the hundreds: an MSE of 1e5 before any update."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(2048, 6, generator=g) * torch.tensor([1.0, 10.0, 100.0, 1000.0, 5.0, 50.0])
    y = x @ torch.tensor([[0.3], [0.02], [0.004], [0.0005], [0.2], [0.01]]) * 100 + 200
    return x, y


def _train(lr: float, steps: int, guarded: bool, saved: dict[str, object] | None = None,
           standardised: bool = False, policy: str = "raise") -> list[float]:
    """The regression script: SGD with momentum 0.9, as a user writes it. ``saved``: the
    weights and momentum just before each ``opt.step()`` (to compare with what is left);
    ``standardised``: with the first fix nanguard suggests for it applied."""
    torch.manual_seed(0)
    x, y = _unscaled()
    if standardised:
        mean, std = x.mean(0), x.std(0).clamp_min(1e-8)
        x = (x - mean) / std
        y = (y - y.mean()) / y.std()
    net = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    losses: list[float] = []
    # one snapshot, before the first update: which later ones the budget allows depends on timing
    ctx = nanguard.attach(net, opt, policy=policy, snapshot_every=1000) if guarded else None
    if ctx is not None:
        ctx.__enter__()
    try:
        for _ in range(steps):
            idx = torch.randint(0, 2048, (64,))
            opt.zero_grad()
            loss = F.mse_loss(net(x[idx]), y[idx])
            loss.backward()
            if saved is not None:
                saved["net"], saved["opt"] = net, opt
                saved["weights"] = [p.detach().clone() for p in net.parameters()]
                saved["momentum"] = [opt.state[p]["momentum_buffer"].clone() for p in net.parameters()
                                     if "momentum_buffer" in opt.state[p]]
            opt.step()
            losses.append(float(loss))
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)
    return losses


def test_unscaled_data_is_the_root_and_the_default_modes_advice_was_tried() -> None:
    """Raw features up to 1000 and targets in the hundreds, SGD(lr=0.1, momentum=0.9): NaN. The
    root is the data's scale (``unscaled-data``, with its numbers): first fix standardise — applied
    by hand, the script trains at its own learning rate. The learning-rate line after it is one
    that trained on the failing step (the back-offs recover tries first did not), keeps
    ``momentum=0.9``, and applied by hand trains too. The run is left as it failed."""
    saved: dict[str, object] = {}
    with pytest.raises(NonFiniteError) as info:
        _train(0.1, 100, guarded=True, saved=saved)
    d = info.value.diagnosis
    assert d is not None and d.cause is Cause.UNSCALED_DATA and d.rule == "unscaled_data"
    assert any(re.match(r"the input features differ in scale 9\d\dx", e) for e in d.evidence), d.evidence
    assert any(e.startswith("the mse_loss was already 1.") and "targets up to 4" in e for e in d.evidence)
    assert d.fixes[0].startswith("mean, std = x.mean(0), x.std(0)") and d.fixes[1].startswith("y = (y - y.mean())")
    assert d.trials and d.trials[-1]["verified"] and not any(t["verified"] for t in d.trials[:-1])
    assert d.trials[0]["lr_factor"] is not None and d.trials[0]["from_step"] == 0
    good = d.trials[-1]["lr"]
    m = re.match(r"opt = torch\.optim\.SGD\(net\.parameters\(\), lr=([0-9.e+-]+), momentum=0\.9\)"
                 r"  # was 0\.1; verified on the failing step: loss ", d.fixes[2])
    assert m is not None, d.fixes
    assert float(m.group(1)) == pytest.approx(good)
    text = str(info.value)
    assert f"tried on the failing step (from the snapshot of step {d.trials[0]['from_step']}):" in text
    assert "(loss did not go down)" in text and "(verified)" in text
    # the run is left as it failed: the weights and the momentum of the failing step's start
    net, opt = saved["net"], saved["opt"]
    assert isinstance(net, nn.Module) and isinstance(opt, torch.optim.SGD)
    for p, w in zip(net.parameters(), saved["weights"]):  # type: ignore[call-overload]
        assert torch.equal(p.detach(), w)
    for p, b in zip(net.parameters(), saved["momentum"]):  # type: ignore[call-overload]
        assert torch.equal(opt.state[p]["momentum_buffer"], b)
    # applied by hand, the first fix trains at the script's own learning rate
    losses = _train(0.1, 300, guarded=False, standardised=True)
    assert all(v == v and v < float("inf") for v in losses) and sum(losses[-20:]) / 20 < 0.01
    # and the verified learning rate trains the unscaled data without a NaN, the loss going down
    losses = _train(float(m.group(1)), 300, guarded=False)
    assert all(v == v and v < float("inf") for v in losses)
    assert sum(losses[-20:]) / 20 < 0.2 * losses[0]
    # a learning rate 100× lower, as the rules alone might size it, does not: the trial mattered
    assert not all(v < 1e12 for v in _train(0.001, 300, guarded=False))


def test_recover_stops_on_unscaled_data_with_the_diagnosis() -> None:
    """No back-off cures the data's scale (a learning rate 1e-6× the script's keeps it finite and
    learns next to nothing): ``recover`` stops with the diagnosis, before any update is applied."""
    with pytest.raises(NonFiniteError) as info:
        _train(0.1, 100, guarded=True, policy="recover")
    d = info.value.diagnosis
    assert d is not None and d.cause is Cause.UNSCALED_DATA
    assert d.fixes[0].startswith("mean, std = x.mean(0)")


def test_without_an_affordable_snapshot_the_advice_is_shown_untried(monkeypatch: pytest.MonkeyPatch) -> None:
    """A state too large to copy under ``raise``: no snapshot, nothing tried, the advice as the
    rules size it — never said to be verified."""
    monkeypatch.setattr(SnapshotBudget, "MAX_BYTES", 0)
    with pytest.raises(NonFiniteError) as info:
        _train(0.1, 100, guarded=True)
    d = info.value.diagnosis
    assert d is not None and d.cause is Cause.UNSCALED_DATA and not d.trials
    assert re.search(r"lr=[0-9.e-]+, momentum=0\.9\)  # was 0\.1$", d.fixes[2]), d.fixes


def _case(trials: tuple[Trial, ...]) -> list[str]:
    h = History()
    for i in range(10):  # |g| 1, lr 50, weights 10·1.5^i: update/weight ratio 5/1.5^i
        h.append(StepRecord(step=i, loss=1.0 + i, grad_norm=1.0, param_norm=10.0 * 1.5**i, lr=50.0))
    f = Finding(phase="forward", op="aten.mse_loss.default", step=10, module="")
    d = diagnose(f, h, RunContext(optimizer="SGD", hyper={"lr": 50.0}, trials=trials))
    assert d.cause is Cause.LEARNING_RATE_TOO_HIGH
    return d.fixes


def test_learning_rates_that_did_not_train_are_never_suggested_as_working() -> None:
    """Every learning rate tried rose or went NaN: the one suggested is below them all and says
    it is untried, naming those that failed."""
    tried = (Trial(Fix(lr_factor=0.01), (5.0, 9.0, 30.0, 80.0), 4, lr=0.5),
             Trial(Fix(lr_factor=0.001), (5.0, 6.0, float("nan")), 4, lr=0.05))
    fixes = _case(tried)
    assert "lr=0.005)  # was 50; untried: lr=0.5, 0.05 did not train on the failing step" in fixes[0], fixes[0]
    assert "verified" not in " ".join(fixes)


def test_a_clip_that_trained_where_no_learning_rate_was_tried_goes_first() -> None:
    fixes = _case((Trial(Fix(clip_norm=2.0), (5.0, 4.0, 3.0, 2.5), 4),))
    assert fixes[0].startswith("torch.nn.utils.clip_grad_norm_(") and fixes[0].endswith(
        "# verified on the failing step: loss 5 → 2.5"), fixes


def test_the_snapshot_budget_keeps_copies_cheap_and_small() -> None:
    b = SnapshotBudget()
    size = 1 << 20
    assert b.due(0, None, 50, lambda: size)  # a first copy of a small state, before any time is known
    assert not b.due(0, None, 50, lambda: SnapshotBudget.FIRST_BYTES + 1)
    assert not b.due(10, 0, 50, lambda: size)  # not yet due
    for t in range(10):
        b.tick(t * 0.001)  # 1 ms steps
    b.cost = 0.0001  # a 0.1 ms copy: 0.2 % of 50 steps is 0.1 ms
    assert b.due(50, 0, 50, lambda: size)
    b.cost = 0.001  # a 1 ms copy: only every 500 steps
    assert not b.due(499, 0, 50, lambda: size) and b.due(500, 0, 50, lambda: size)
    assert not b.due(5000, 0, 50, lambda: SnapshotBudget.MAX_BYTES + 1)


class _VAE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc, self.mu, self.logvar = nn.Linear(64, 32), nn.Linear(32, 8), nn.Linear(32, 8)
        self.dec = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 64))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = F.relu(self.enc(x))
        mu, lv = self.mu(h), self.logvar(h)
        z = mu + torch.exp(0.5 * lv) * torch.randn_like(mu)
        return self.dec(z), mu, lv


def _vae(lr: float, steps: int, guarded: bool) -> list[float]:
    torch.manual_seed(0)
    x = torch.rand(1024, 64)
    m = _VAE()
    opt = torch.optim.Adam(m.parameters(), lr=lr)
    out = []
    with nanguard.attach(m, opt) if guarded else torch.enable_grad():
        for _ in range(steps):
            xb = x[torch.randint(0, 1024, (64,))]
            opt.zero_grad()
            rec, mu, lv = m(xb)
            loss = (F.binary_cross_entropy_with_logits(rec, xb, reduction="sum")
                    - 0.5 * torch.sum(1 + lv - mu.pow(2) - lv.exp()))
            loss.backward()
            opt.step()
            out.append(float(loss.detach()))
    return out


def test_an_exp_pushed_over_by_the_update_before_it_is_the_learning_rate() -> None:
    """A VAE whose one Adam step at a learning rate 2,500× too high pushed the log-variance to
    ±1,480: the ``exp`` of it overflows at step 1. The update (ratio ≈ 1, as large as the weights)
    is the cause, not the ``exp``: ``learning-rate-too-high``, its first fix a learning rate that
    trained on the failing step — and applied by hand, the VAE trains without a NaN."""
    with pytest.raises(NonFiniteError) as info:
        _vae(2.5, 50, guarded=True)
    f, d = info.value.finding, info.value.diagnosis
    assert f.op == "aten.exp.default" and f.step == 1
    assert d is not None and d.cause is Cause.LEARNING_RATE_TOO_HIGH and d.rule == "update_made_the_symptom"
    assert any(e.startswith("the update just before was about as large as the weights: update/weight ratio")
               for e in d.evidence)
    assert any("the input of `exp` reached" in e for e in d.evidence)
    m = re.match(r"opt = torch\.optim\.Adam\(m\.parameters\(\), lr=([0-9.e-]+)\)  # was 2\.5; verified", d.fixes[0])
    assert m is not None, d.fixes
    assert d.fixes[-1].startswith("torch.exp(x.clamp(")  # the guard on the op comes after
    losses = _vae(float(m.group(1)), 300, guarded=False)
    assert all(v == v and abs(v) < float("inf") for v in losses)


def test_running_statistics_made_nonfinite_after_a_huge_update_are_the_learning_rate() -> None:
    """BatchNorm's ``running_var`` is the first non-finite value, one step after an update as
    large as the weights: the update is the cause (recovery can start), not a corrupt checkpoint.
    The same buffer with healthy updates before it stays ``nonfinite-parameters``."""
    from _rule_cases import AFTER_HUGE_UPDATE, CALM, case
    from nanguard.core.diagnosis import diagnose_case

    for trend, cause in ((AFTER_HUGE_UPDATE, Cause.LEARNING_RATE_TOO_HIGH), (CALM, Cause.NONFINITE_PARAMETERS)):
        d = diagnose_case(case("torch", trend, phase="forward", op="parameter", module="bn1", origin="parameter",
                               parameters=("bn1.running_var",), posinf=16, step=5))
        assert d.cause is cause, (trend, d)
    d = diagnose_case(case("torch", AFTER_HUGE_UPDATE, phase="forward", op="parameter", module="fc",
                           origin="parameter", parameters=("fc.weight", "bn1.running_var"), nan=4, step=5))
    assert d.cause is Cause.NONFINITE_PARAMETERS  # a weight among them: not a buffer's symptom


def test_a_usual_weight_decay_beside_an_absurd_learning_rate_blames_the_learning_rate() -> None:
    """``AdamW(lr=30, weight_decay=0.1)``: lr × wd = 3, but 0.1 is a usual decay — the learning
    rate is what is 10,000× off, and its fix must lower it (it kept ``lr=30`` and cut the decay)."""
    from _rule_cases import GROWING, case
    from nanguard.core.diagnosis import diagnose_case

    def fixes(wd: float) -> tuple[Cause, str, str]:
        d = diagnose_case(case("torch", GROWING, phase="forward", op="aten.addmm.default", posinf=3,
                               ctx=RunContext(optimizer="AdamW", hyper={"lr": 30.0, "weight_decay": wd})))
        return d.cause, d.rule or "", d.fixes[0]

    cause, rule, first = fixes(0.1)
    assert cause is Cause.LEARNING_RATE_TOO_HIGH and rule != "decay_too_strong" and "lr=30" not in first, first
    cause, rule, first = fixes(5.0)  # an unusual decay: it is named, the learning rate kept
    assert rule == "decay_too_strong" and "weight_decay=" in first


def _decayed(wd: float, policy: str | None, steps: int = 200) -> tuple[float, Any]:
    """AdamW at lr 5e-3 on a regression: the mean loss of the last 50 steps, and the guard."""
    torch.manual_seed(0)
    x = torch.randn(512, 8)
    y = x @ torch.randn(8, 1) + 0.1 * torch.randn(512, 1)
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.AdamW(net.parameters(), lr=5e-3, weight_decay=wd)
    losses: list[float] = []
    guard = nanguard.attach(net, opt, policy=policy) if policy else None
    with guard if guard is not None else contextlib.nullcontext():
        for _ in range(steps):
            idx = torch.randint(0, 512, (64,))
            opt.zero_grad()
            loss = F.mse_loss(net(x[idx]), y[idx])
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    return sum(losses[-50:]) / 50, guard


def test_recover_sets_a_weight_decay_too_strong_for_the_learning_rate_instead_of_backing_it_off() -> None:
    """``AdamW(lr=5e-3, weight_decay=1e3)``: lr × wd = 5 flips and grows the weights each step.
    No learning rate trains on the failing step (the decay still shrinks the weights: it gave
    up); the weight decay sized for the learning rate does — tried, applied, and the run ends
    where the sane run does (0.043 against 0.040 with weight_decay=0.01, last 50 of 200 steps)."""
    sane, _ = _decayed(0.01, None)
    final, guard = _decayed(1e3, "recover")
    (rec,) = guard.recoveries
    assert rec["action"] == "rollback" and rec["verified"] is True and rec["weight_decay"] == 0.02
    assert rec["description"] == "rollback + weight_decay=0.02" and "lr_factor" not in rec
    assert rec["trials"][0]["fix"] == "weight_decay=0.02"
    assert final < 1.5 * sane


def test_the_default_mode_tries_the_weight_decay_it_suggests() -> None:
    with pytest.raises(NonFiniteError) as info:
        _decayed(1e3, "raise")
    d = info.value.diagnosis
    assert d is not None and d.rule == "decay_too_strong"
    assert d.fixes[0].startswith("opt = torch.optim.AdamW(net.parameters(), lr=0.005, weight_decay=0.02"), d.fixes
    assert re.search(r"  # was weight_decay=1e\+03; verified on the failing step: loss [\d.]+ → [\d.]+$", d.fixes[0]), d.fixes[0]
    assert "verified" not in d.fixes[1], d.fixes  # the learning-rate line was not what trained


def test_a_hand_written_update_is_told_to_lower_its_own_learning_rate() -> None:
    """No optimizer (``p -= lr * p.grad``): the fix is the script's own learning rate, not an SGD
    optimizer to create, and no scheduler for an optimizer it does not have."""
    from _rule_cases import GROWING, case
    from nanguard.core.diagnosis import diagnose_case

    d = diagnose_case(case("torch", GROWING, phase="forward", op="aten.addmm.default", posinf=3,
                           ctx=RunContext(optimizer=None)))
    assert d.fixes[0].startswith("lr = lr * 0.025  # the learning rate of your own update"), d.fixes
    assert not any("torch.optim" in f for f in d.fixes), d.fixes
