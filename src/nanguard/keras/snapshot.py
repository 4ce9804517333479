"""Snapshots for rollback: every variable of the model and of its optimizer(s), on the host.

Taken by the ``skip`` and ``recover`` policies before the first update (when the optimizer is
already built) and then after a healthy step, every ``every`` steps. One snapshot is kept at a
time; its size is that of ``model.variables`` (weights, BatchNorm statistics, dropout seeds) plus
the optimizer's variables (for Adam about 3x the weights, plus the iteration count and learning
rate). Restoring assigns every value back, bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Snapshot", "Snapshotter"]


@dataclass
class Snapshot:
    step: int
    values: list[tuple[Any, np.ndarray[Any, Any]]]
    nbytes: int = 0


@dataclass
class Snapshotter:
    every: int = 50
    last: Snapshot | None = None
    taken: int = field(default=0)

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"snapshot_every must be >= 1, got {self.every}")

    def due(self, step: int) -> bool:
        return self.last is None or step - self.last.step >= self.every

    def take(self, step: int, variables: Sequence[Any]) -> Snapshot:
        values = [(v, np.array(v.numpy(), copy=True)) for v in variables]
        snap = Snapshot(step=step, values=values, nbytes=sum(a.nbytes for _, a in values))
        self.last = snap
        self.taken += 1
        return snap

    @staticmethod
    def restore(snap: Snapshot) -> None:
        """Every variable back to its value when ``snap`` was taken."""
        for v, a in snap.values:
            v.assign(a)
