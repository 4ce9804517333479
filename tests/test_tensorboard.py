"""TensorBoard writes what ``docs/report.md`` says it writes: each ``nanguard/`` tag at exactly
the documented steps, once each, read back from the event file of a real guarded training loop
(torch on the CPU, in this process: a 12-step ``nn.Linear`` regression under SGD)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nanguard
from nanguard import NonFiniteError
from nanguard.core.history import History
from nanguard.integrations.tensorboard import TensorBoardLogger

pytest.importorskip("tensorboard")

STEPS = 12
#: written at every step
EVERY = ("loss", "grad_norm", "lr", "nonfinite", "skipped")
#: written at the steps whose weights the guard read
WEIGHTS = ("param_norm", "update_ratio")
#: policy ``raise`` on the CPU, small updates: steps 0-2, the step before the 8th, the last one
READ_SMALL = [0, 1, 2, 7, STEPS - 1]


def _scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """Tag (without ``nanguard/``) -> ``[(step, value), ...]`` as written, from the one event
    file (records: uint64 length, uint32 CRC, the ``Event`` proto, uint32 CRC)."""
    from tensorboard.compat.proto import event_pb2

    (path,) = logdir.glob("events.out.tfevents.*")
    data, pos = path.read_bytes(), 0
    out: dict[str, list[tuple[int, float]]] = {}
    while pos < len(data):
        (n,) = struct.unpack("<Q", data[pos : pos + 8])
        event = event_pb2.Event.FromString(data[pos + 12 : pos + 12 + n])
        pos += 12 + n + 4
        for v in event.summary.value:
            if v.HasField("simple_value"):
                tag = v.tag.removeprefix("nanguard/")
                out.setdefault(tag, []).append((event.step, v.simple_value))
    return out


def _steps(scalars: dict[str, list[tuple[int, float]]], tag: str) -> list[int]:
    return [s for s, _ in scalars.get(tag, [])]


def _train(logdir: Path, lr: float, *, policy: str = "raise", optimizer_known: bool = True,
           nan_at: int | None = None, micro: int = 1) -> History:
    """Twelve steps with a ``TensorBoardLogger`` watching the guard, then ``detach()`` and
    ``close()`` (also when the guard raised). ``micro``: ``backward()`` calls per step;
    ``optimizer_known=False`` attaches to the model alone (as ``nanguard run`` does)."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x = torch.randn(64, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1
    guard = nanguard.attach(model, opt if optimizer_known else None, policy=policy)
    tb = TensorBoardLogger(str(logdir))
    tb.watch(guard)
    try:
        for step in range(STEPS):
            opt.zero_grad()
            for xb, yb in zip(x.chunk(micro), y.chunk(micro)):
                if step == nan_at:
                    xb = xb.clone()
                    xb[0, 0] = float("nan")
                F.mse_loss(model(xb), yb).backward()
            opt.step()
    finally:
        guard.detach()
        tb.close()
    return guard.history


def _values_match(scalars: dict[str, list[tuple[int, float]]], history: History) -> None:
    """Every value written is the record's own (float32, as TensorBoard stores it)."""
    recs = {r.step: r for r in history}
    for tag in ("loss", "grad_norm", "lr", *WEIGHTS):
        for step, v in scalars.get(tag, []):
            assert v == pytest.approx(getattr(recs[step], tag), rel=1e-6, nan_ok=True), (tag, step)


def test_small_updates_have_the_weights_at_the_documented_steps(tmp_path: Path) -> None:
    # lr 1e-4: each update moves the weights by far less than 2.5 % of their norm
    history = _train(tmp_path, 1e-4)
    scalars = _scalars(tmp_path)
    for tag in EVERY:
        assert _steps(scalars, tag) == list(range(STEPS)), tag
    for tag in WEIGHTS:
        assert _steps(scalars, tag) == READ_SMALL, tag
    assert set(scalars) == {*EVERY, *WEIGHTS}
    _values_match(scalars, history)
    assert {v for _, v in scalars["nonfinite"]} == {v for _, v in scalars["skipped"]} == {0.0}


def test_large_updates_have_the_weights_at_every_step(tmp_path: Path) -> None:
    # the run (lr 0.05 on fresh weights): every update moves them by 10 % or more
    history = _train(tmp_path, 0.05)
    scalars = _scalars(tmp_path)
    for tag in (*EVERY, *WEIGHTS):
        assert _steps(scalars, tag) == list(range(STEPS)), tag
    _values_match(scalars, history)


@pytest.mark.parametrize("policy", ["skip", "recover"])
def test_skip_and_recover_have_the_weights_at_every_step(tmp_path: Path, policy: str) -> None:
    history = _train(tmp_path, 1e-4, policy=policy, nan_at=5)
    scalars = _scalars(tmp_path)
    for tag in (*EVERY, "param_norm"):
        assert _steps(scalars, tag) == list(range(STEPS)), tag
    # the non-finite step made no update: no ratio there
    assert _steps(scalars, "update_ratio") == [s for s in range(STEPS) if s != 5]
    assert [s for s, v in scalars["nonfinite"] if v] == [5]
    assert [s for s, v in scalars["skipped"] if v] == [5]
    _values_match(scalars, history)


def test_raise_reads_the_weights_of_the_step_before_a_non_finite_one(tmp_path: Path) -> None:
    with pytest.raises(NonFiniteError):
        _train(tmp_path, 1e-4, nan_at=5)
    scalars = _scalars(tmp_path)
    for tag in EVERY:
        assert _steps(scalars, tag) == list(range(6)), tag  # the failing step 5 too
    for tag in WEIGHTS:
        assert _steps(scalars, tag) == [0, 1, 2, 4], tag
    assert [s for s, v in scalars["nonfinite"] if v] == [5]


def test_the_deferred_watch_is_written_once_its_numbers_are_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the GPU's watch (forced on the CPU): loss, gradient norm and weights read a step or two
    # after their step ended, and the weights at every step
    monkeypatch.setenv("NANGUARD_WATCH_DEFERRED", "1")
    history = _train(tmp_path, 1e-4)
    scalars = _scalars(tmp_path)
    for tag in (*EVERY, *WEIGHTS):
        assert _steps(scalars, tag) == list(range(STEPS)), tag
    _values_match(scalars, history)


def test_steps_before_the_first_optimizer_step_are_written_once_as_redone(tmp_path: Path) -> None:
    # attached to the model alone, three backward() calls a step: until the first
    # optimizer.step() each backward() was counted as a step; that step withdrew and redid them
    history = _train(tmp_path, 1e-4, optimizer_known=False, micro=3)
    scalars = _scalars(tmp_path)
    for tag in EVERY:
        assert _steps(scalars, tag) == list(range(STEPS)), tag
    for tag in WEIGHTS:
        assert _steps(scalars, tag) == READ_SMALL, tag
    _values_match(scalars, history)
