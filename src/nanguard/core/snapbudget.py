"""When policy ``raise`` keeps a snapshot (framework-free).

Under ``raise`` nothing is rolled back, so no snapshot is needed to recover — only to try the
advice on the failing step before it is shown (the fixes ``recover`` would try, from the newest
snapshot: :meth:`~nanguard.core.controller.StepController.advice_trials`). The adapters ask
:meth:`SnapshotBudget.due` at each healthy step; a copy is then kept only while it is cheap and
small, so the healthy run pays (almost) nothing for advice it may never need.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["SnapshotBudget"]


@dataclass
class SnapshotBudget:
    """When policy ``raise`` keeps a snapshot: it needs none to recover, only to try the advice
    on the failing step (the fixes ``recover`` would try, from the newest snapshot). Asked at the
    check of each healthy step, before its update (:meth:`due`): a copy is taken every ``every``
    steps — or less often, so that copying costs at most :data:`BUDGET` of the steps' time — and
    only while the state (weights, buffers, optimizer state) is at most :data:`MAX_BYTES`."""

    #: the share of the steps' time the copies may cost, amortised (the watch's budget is 2 %)
    BUDGET = 0.002
    #: a larger state is not copied under ``raise`` (the advice is then offered untried)
    MAX_BYTES = 256 << 20
    #: before a step time is known, a state up to this size is copied (a first snapshot)
    FIRST_BYTES = 16 << 20

    cost: float | None = None  # seconds the last copy took
    _times: list[float] = field(default_factory=list)
    _last: float | None = None

    def tick(self, now: float) -> None:
        """A healthy step's check (``now``: ``time.perf_counter()``): the time between two."""
        if self._last is not None:
            self._times.append(now - self._last)
            del self._times[:-9]
        self._last = now

    def step_time(self) -> float | None:
        return sorted(self._times)[len(self._times) // 2] if self._times else None

    def due(self, step: int, last_step: int | None, every: int, nbytes: Callable[[], int]) -> bool:
        """Should a copy be taken at ``step`` (the last was at ``last_step``)?"""
        if last_step is not None and step - last_step < every:
            return False  # the cheap test first: most steps stop here
        size = nbytes()
        if size > self.MAX_BYTES:
            return False
        st = self.step_time()
        if self.cost is None or st is None:
            return size <= self.FIRST_BYTES
        if last_step is None:
            return True
        return step - last_step >= max(every, self.cost / (self.BUDGET * max(st, 1e-9)) - 1e-6)
