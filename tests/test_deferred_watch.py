"""The deferred watch (GPU mode, forced on the CPU with NANGUARD_WATCH_DEFERRED=1): no host read
on a healthy step, the update skipped on the device, the failure caught one step later at the
right op, on the weights the failing step ran with."""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nanguard
from nanguard import Cause, NonFiniteError
from nanguard.torch import _deferred

#: every Python way to read a tensor's value on the host (on CUDA each one synchronises)
_READS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "numpy", "cpu")


@contextlib.contextmanager
def count_host_reads() -> Iterator[list[str]]:
    """Count host reads of tensor values, except the deferred watch's read of its own host
    buffer (on CUDA: pinned memory after an event that completed a step ago — no device sync)."""
    reads: list[str] = []
    saved = {n: getattr(torch.Tensor, n) for n in _READS}
    own = [0]

    def counting(name: str):  # type: ignore[no-untyped-def]
        orig = saved[name]

        def read(self, *a, **k):  # type: ignore[no-untyped-def]
            if not own[0]:
                reads.append(name)
            return orig(self, *a, **k)

        return read

    orig_values = _deferred.InFlight.values

    def values(self):  # type: ignore[no-untyped-def]
        own[0] += 1
        try:
            return orig_values(self)
        finally:
            own[0] -= 1

    for n in _READS:
        setattr(torch.Tensor, n, counting(n))
    _deferred.InFlight.values = values  # type: ignore[method-assign]
    try:
        yield reads
    finally:
        for n, f in saved.items():
            setattr(torch.Tensor, n, f)
        _deferred.InFlight.values = orig_values  # type: ignore[method-assign]


class LogLayer(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x + 1.0)  # log(0) where a feature is -1


def _model() -> nn.Module:
    return nn.Sequential(OrderedDict(log=LogLayer(), fc1=nn.Linear(8, 16), act=nn.Tanh(),
                                     fc2=nn.Linear(16, 1)))


def _batch(bad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.rand(16, 8)
    if bad:
        x[2, 5] = -1.0
    return x, torch.randn(16, 1)


@pytest.fixture(autouse=True)
def _deferred_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NANGUARD_WATCH_DEFERRED", "1")


def _step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    opt.zero_grad(set_to_none=True)
    F.mse_loss(model(x), y).backward()
    opt.step()


@pytest.mark.parametrize("fused", [False, True])
def test_no_host_read_on_a_healthy_step(fused: bool) -> None:
    """nanguard adds no host read to a healthy step: with a fused Adam a step makes none at all;
    the plain Adam reads its own CPU step counters (``_get_value``), with or without nanguard."""
    torch.manual_seed(0)
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=fused or None)
    batches = [_batch() for _ in range(12)]

    def reads_per_step() -> list[list[str]]:
        out = []
        for x, y in batches:
            with count_host_reads() as reads:
                _step(model, opt, x, y)
            out.append(list(reads))
        return out

    plain = reads_per_step()
    with nanguard.attach(model, opt) as guard:
        assert guard.opt_hooks.defer is None  # decided at the first check
        guarded = reads_per_step()
        assert guard.opt_hooks.defer is True
    assert guarded == plain
    if fused:
        assert guarded == [[]] * len(batches)
    # the numbers of every step reach the history, one step late
    assert len(guard.history) == 12 and guard.findings == []
    assert all(r.grad_norm is not None and r.grad_norm > 0 and r.loss is not None for r in guard.history)


def test_healthy_training_is_unchanged_by_the_masked_update() -> None:
    def run(guarded: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = _model()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        batches = [_batch() for _ in range(6)]
        with nanguard.attach(model, opt) if guarded else contextlib.nullcontext():
            for x, y in batches:
                _step(model, opt, x, y)
        return [p.detach().clone() for p in model.parameters()]

    assert all(torch.equal(a, b) for a, b in zip(run(False), run(True)))


@pytest.mark.parametrize("fused", [False, True])
def test_failure_is_caught_one_step_later_at_its_op_and_the_update_never_happened(fused: bool) -> None:
    torch.manual_seed(0)
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, fused=fused or None)
    batches = [_batch(bad=i == 3) for i in range(8)]
    before_bad: list[torch.Tensor] = []
    with pytest.raises(NonFiniteError) as info, nanguard.attach(model, opt) as guard:
        for i, (x, y) in enumerate(batches):
            if i == 3:
                before_bad = [p.detach().clone() for p in model.parameters()]
            _step(model, opt, x, y)
    f = info.value.finding
    assert (f.op, f.phase, f.module, f.step) == ("aten.log.default", "forward", "log", 3)
    assert f.detected_by == "replay"
    assert info.value.diagnosis is not None and info.value.diagnosis.cause is Cause.UNSAFE_OP
    # raised at step 4's optimizer.step(), before its update; step 3's update was skipped on the
    # device: the weights are those step 3 ran with
    assert guard.step >= 4
    assert all(torch.equal(a, b) for a, b in zip(before_bad, model.parameters()))
    assert guard.history[3].finite is False and guard.history[3].skipped


def test_a_failure_at_the_last_step_is_read_when_the_guard_detaches() -> None:
    torch.manual_seed(0)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    guard = nanguard.attach(model, opt)
    _step(model, opt, *_batch())
    _step(model, opt, *_batch(bad=True))
    with pytest.raises(NonFiniteError) as info:
        guard.detach()
    assert (info.value.finding.op, info.value.finding.step) == ("aten.log.default", 1)
    assert guard.installed is False


def test_skip_policy_keeps_the_synchronous_check() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    with nanguard.attach(model, opt, policy="skip") as guard:
        _step(model, opt, *_batch())
    assert guard.opt_hooks.defer is False


def test_a_closure_step_keeps_the_synchronous_check() -> None:
    """LBFGS checks after each closure call inside one step: no device-side mask there."""
    torch.manual_seed(0)
    model = _model()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=4)
    x, y = _batch()

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        return loss

    with nanguard.attach(model, opt) as guard:
        for _ in range(3):
            opt.step(closure)
        assert guard.opt_hooks.deferred.idle
    assert guard.findings == [] and len(guard.history) == 3
