"""Snapshots for rollback: weights, buffers, optimizer, LR schedulers, GradScaler and RNG.

Taken under ``skip``/``recover`` before the first update, then every ``every`` steps after a step
that was healthy by the step controller's signals (the last known good state). Two are kept —
the newest and the one before it (an escalated rollback goes there) — as CPU copies: each the
size of the weights, the floating buffers and the optimizer state together (for Adam about 3×
the weights) — the bound stated in the docs. With ``directory`` set it is also written there with ``torch.save`` and read back with
``torch.load(weights_only=True)``. Restoring copies every value back bit for bit.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ._recorder import RngState

__all__ = ["Snapshot", "Snapshotter"]


def _to_cpu(obj: Any) -> Any:
    """Deep copy of a state dict with every tensor cloned to the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_to_cpu(v) for v in obj)
    return obj


def _nbytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v) for v in obj)
    return 0


@dataclass
class Snapshot:
    step: int
    params: list[torch.Tensor]
    buffers: list[torch.Tensor]
    optimizers: list[dict[str, Any]]
    schedulers: list[dict[str, Any]]
    scalers: list[dict[str, Any]]
    rng: RngState
    path: str | None = None
    nbytes: int = 0
    #: the live objects it was taken of (what :meth:`Snapshotter.restore` copies back into),
    #: set by the actuator: a snapshot is restored into what it holds, even after a second
    #: optimizer joined the run
    targets: tuple[Any, ...] | None = field(default=None, repr=False, compare=False)


@dataclass
class Snapshotter:
    """Takes and restores :class:`Snapshot` s of what one guard watches."""

    every: int = 50
    directory: str | None = None
    taken: int = field(default=0)
    keep: int = 2
    ring: list[Snapshot] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"snapshot_every must be >= 1, got {self.every}")

    @property
    def last(self) -> Snapshot | None:
        """The newest snapshot (``None``: none yet)."""
        return self.ring[-1] if self.ring else None

    @last.setter
    def last(self, snap: Snapshot | None) -> None:
        self.ring = [] if snap is None else [*self.ring, snap][-self.keep:]

    def target(self, older: bool = False) -> Snapshot | None:
        """What a rollback restores: the newest snapshot, or with ``older`` the one before it
        (dropping the newer one: it did not hold a state the run could come back from)."""
        if older and len(self.ring) > 1:
            self.ring.pop()
        return self.last

    def due(self, step: int) -> bool:
        return self.last is None or step - self.last.step >= self.every

    @staticmethod
    def copy(
        step: int,
        params: Sequence[torch.Tensor],
        buffers: Sequence[torch.Tensor],
        optimizers: Sequence[torch.optim.Optimizer],
        schedulers: Sequence[Any],
        scalers: Sequence[Any],
    ) -> Snapshot:
        """A CPU copy of the state as it is now, kept nowhere (:meth:`take` keeps one in the
        ring; a trial under ``raise`` copies the failing state to leave the run as it was)."""
        snap = Snapshot(
            step=step,
            params=[p.detach().to("cpu", copy=True) for p in params],
            buffers=[b.detach().to("cpu", copy=True) for b in buffers],
            optimizers=[_to_cpu(o.state_dict()) for o in optimizers],
            schedulers=[_to_cpu(s.state_dict()) for s in schedulers],
            scalers=[_to_cpu(s.state_dict()) for s in scalers],
            rng=RngState.capture(),
        )
        snap.nbytes = _nbytes([snap.params, snap.buffers, snap.optimizers])
        return snap

    def take(
        self,
        step: int,
        params: Sequence[torch.Tensor],
        buffers: Sequence[torch.Tensor],
        optimizers: Sequence[torch.optim.Optimizer],
        schedulers: Sequence[Any],
        scalers: Sequence[Any],
    ) -> Snapshot:
        snap = self.copy(step, params, buffers, optimizers, schedulers, scalers)
        if self.directory:
            os.makedirs(self.directory, exist_ok=True)
            path = os.path.join(self.directory, "nanguard-snapshot.pt")
            torch.save(
                {
                    "step": step,
                    "params": snap.params,
                    "buffers": snap.buffers,
                    "optimizers": snap.optimizers,
                    "schedulers": snap.schedulers,
                    "scalers": snap.scalers,
                    "rng_cpu": snap.rng.cpu,
                },
                path + ".tmp",
            )
            os.replace(path + ".tmp", path)
            snap.path = path
        self.last = snap  # appended to the ring
        self.taken += 1
        return snap

    def load(self, path: str) -> Snapshot:
        """Read a snapshot written with ``directory`` (tensors only: ``weights_only=True``)."""
        d = torch.load(path, weights_only=True)
        return Snapshot(
            step=int(d["step"]),
            params=d["params"],
            buffers=d["buffers"],
            optimizers=d["optimizers"],
            schedulers=d["schedulers"],
            scalers=d["scalers"],
            rng=RngState(d["rng_cpu"]),
            path=path,
        )

    @staticmethod
    def restore(
        snap: Snapshot,
        params: Sequence[torch.Tensor],
        buffers: Sequence[torch.Tensor],
        optimizers: Sequence[torch.optim.Optimizer],
        schedulers: Sequence[Any],
        scalers: Sequence[Any],
        keep_versions: bool = False,
    ) -> None:
        """Put everything back as it was when ``snap`` was taken, bit for bit. ``keep_versions``:
        write the weights through ``.data`` (autograd's version counters left alone) — a run with
        several optimizers may hold a graph built on one model's weights while another's step
        rolls them back; the step of that graph is skipped, but its ``backward()`` must not raise."""
        with torch.no_grad():
            for p, v in zip(params, snap.params):
                (p.data if keep_versions else p).copy_(v)
            for b, v in zip(buffers, snap.buffers):
                if b.shape == v.shape:
                    b.copy_(v)
        for o, sd in zip(optimizers, snap.optimizers):
            o.load_state_dict(_to_cpu(sd))
        for s, sd in zip(schedulers, snap.schedulers):
            s.load_state_dict(dict(sd))
        for s, sd in zip(scalers, snap.scalers):
            s.load_state_dict(dict(sd))
        snap.rng.restore()


# instances created while a guard is active (found by class-level __init__ patches)
SCHEDULERS: weakref.WeakSet[Any] = weakref.WeakSet()


def module_buffers(modules: Sequence[nn.Module]) -> list[torch.Tensor]:
    """Every buffer (BatchNorm's ``num_batches_tracked`` too): what a snapshot restores."""
    out: list[torch.Tensor] = []
    seen: set[int] = set()
    for m in modules:
        for b in m.buffers():
            if b is not None and id(b) not in seen and b.device.type != "meta":
                seen.add(id(b))
                out.append(b)
    return out


def floating_buffers(modules: Sequence[nn.Module]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    seen: set[int] = set()
    for m in modules:
        for b in m.buffers():
            if b is not None and b.is_floating_point() and id(b) not in seen and b.device.type != "meta":
                seen.add(id(b))
                out.append(b)
    return out
