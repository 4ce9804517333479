"""A bounded history of per-step scalars: the evidence the diagnosis rules read.

Filled by the watch tier once per optimizer step (after the fused finiteness check has brought the
numbers to the host anyway), so keeping it costs no extra synchronisation.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["History", "StepRecord"]


@dataclass
class StepRecord:
    """What one step looked like.

    ``loss`` and ``grad_norm`` are read before the update, ``param_norm`` after it;
    ``grad_norm`` is from before the script's own ``clip_grad_norm_`` (``clipped_norm`` after). Any of them may
    be ``None`` when the adapter could not observe it (no optimizer, no loss seen, ...).
    ``layer_grad_norms`` / ``layer_param_norms`` are kept only for the most recent steps.
    """

    step: int
    loss: float | None = None
    grad_norm: float | None = None
    param_norm: float | None = None
    lr: float | None = None
    update_norm: float | None = None  # estimated |Δw| of this step's update (adapter's estimate)
    clipped_norm: float | None = None  # the gradient norm after the script's own clipping
    # (``grad_norm`` is then the norm from before it: what the diagnosis reads)
    finite: bool = True
    skipped: bool = False
    event: str | None = None  # "nonfinite", "skip", "rollback", ...
    optimizer: str | None = None  # which optimizer stepped (set only when a run has several)
    layer_values: list[float] | None = None  # per-tensor gradient norms ...
    layer_names: list[str] | None = None  # ... and their names (a list shared between steps)

    @property
    def layer_grad_norms(self) -> dict[str, float] | None:
        """``{"fc1.weight": 0.31, ...}`` (kept for the last ``History.layer_window`` steps)."""
        if self.layer_values is None or self.layer_names is None:
            return None
        return dict(zip(self.layer_names, self.layer_values))

    @property
    def update_ratio(self) -> float | None:
        """``|Δw| / |w|`` with the adapter's estimate of ``|Δw|`` (else ``lr · |g|``, exact for
        plain SGD)."""
        if not self.param_norm or not math.isfinite(self.param_norm):
            return None
        upd = self.update_norm
        if upd is None:
            g = self.clipped_norm if self.clipped_norm is not None else self.grad_norm
            if self.lr is None or g is None or not math.isfinite(g):
                return None
            upd = self.lr * g
        return upd / self.param_norm if math.isfinite(upd) else None

    def to_dict(self) -> dict[str, Any]:
        def clean(x: Any) -> Any:
            if isinstance(x, float) and not math.isfinite(x):
                return str(x)  # "nan", "inf", "-inf": JSON-safe and still readable
            return x

        d: dict[str, Any] = {
            "step": self.step,
            "loss": clean(self.loss),
            "grad_norm": clean(self.grad_norm),
            "param_norm": clean(self.param_norm),
            "lr": self.lr,
            "finite": self.finite,
        }
        if self.update_norm is not None:
            d["update_norm"] = clean(self.update_norm)
        if self.clipped_norm is not None:
            d["clipped_norm"] = clean(self.clipped_norm)
        if self.skipped:
            d["skipped"] = True
        if self.event:
            d["event"] = self.event
        if self.optimizer:
            d["optimizer"] = self.optimizer
        layers = self.layer_grad_norms
        if layers:
            d["layer_grad_norms"] = {k: clean(v) for k, v in layers.items()}
        return d


def _finite(values: list[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


@dataclass
class History:
    """The last ``maxlen`` steps (default 10 000: a few MB at most).

    Per-layer norms are kept for the last ``layer_window`` steps only.
    """

    maxlen: int = 10_000
    layer_window: int = 32
    _records: deque[StepRecord] = field(default_factory=deque, repr=False)

    def append(self, rec: StepRecord) -> None:
        self._records.append(rec)
        while len(self._records) > self.maxlen:
            self._records.popleft()
        if len(self._records) > self.layer_window:
            old = self._records[-self.layer_window - 1]
            old.layer_values = None

    def pop(self) -> StepRecord | None:
        """Remove and return the newest record (``None`` when empty)."""
        return self._records.pop() if self._records else None

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[StepRecord]:
        return iter(self._records)

    def __getitem__(self, i: int) -> StepRecord:
        return self._records[i]

    def newest(self, limit: int) -> Iterator[StepRecord]:
        """The newest ``limit`` records, newest first (without copying the history)."""
        return itertools.islice(reversed(self._records), limit)

    def last(self, n: int) -> list[StepRecord]:
        return list(self._records)[-n:] if n > 0 else []

    def healthy(self, n: int | None = None) -> list[StepRecord]:
        """The healthy (finite, not skipped) records, oldest first; the last ``n`` of them only
        when ``n`` is given (read from the newest end: a rule asked at every step does not walk
        a history of 10 000 records)."""
        if n is None:
            return [r for r in self._records if r.finite and not r.skipped]
        out: list[StepRecord] = []
        if n > 0:
            for r in reversed(self._records):
                if r.finite and not r.skipped:
                    out.append(r)
                    if len(out) >= n:
                        break
        out.reverse()
        return out

    def series(self, name: str, n: int | None = None) -> list[float]:
        """Finite values of one scalar over the last ``n`` healthy steps."""
        return _finite([getattr(r, name) for r in self.healthy(n)])

    # --- trends the rules use -------------------------------------------------------------
    def growth(self, name: str, window: int = 8) -> tuple[float, float, float] | None:
        """``(first, last, last/first)`` of a scalar over the last ``window`` healthy steps."""
        vals = self.series(name, window)
        if len(vals) < 2 or vals[0] <= 0:
            return None
        return vals[0], vals[-1], vals[-1] / vals[0]

    def per_step_growth(self, name: str, window: int = 8) -> float | None:
        """Geometric mean growth factor per step of a scalar (e.g. 9.0 = ×9 every step), over the
        steps between its first and last known value (a scalar read only every few steps, as the
        weight norm of a quiet run is, grows per step, not per reading)."""
        known = [(r.step, v) for r in self.healthy(window)
                 if isinstance(v := getattr(r, name), (int, float)) and math.isfinite(v)]
        if len(known) < 2 or known[0][1] <= 0 or known[-1][1] <= 0:
            return None
        span = max(known[-1][0] - known[0][0], len(known) - 1)
        return float((known[-1][1] / known[0][1]) ** (1.0 / span))

    def median_update_ratio(self, n: int = 20) -> float | None:
        """Median ``|Δw|/|w|`` over the last ``n`` healthy steps."""
        vals = sorted(
            r.update_ratio for r in self.healthy(n) if r.update_ratio is not None
        )
        return vals[len(vals) // 2] if vals else None

    def norm_change_ratio(self, n: int = 20) -> float | None:
        """Where no step measured its update (a hand-written ``p -= lr * p.grad``: no optimizer,
        no learning rate): a lower bound of ``|Δw|/|w|`` from the weight norm's change between
        consecutive healthy steps (``|Δw| ≥ |‖w'‖ − ‖w‖|``), the lower quartile over the last
        ``n`` healthy steps — a run that diverged over its last steps is sized by where it began,
        as :class:`~nanguard.core.outcome.Level` takes its loss level. ``None`` with fewer than
        two consecutive weight norms."""
        recs = self.healthy(n)
        bounds = sorted(
            abs(b.param_norm - a.param_norm) / a.param_norm
            for a, b in itertools.pairwise(recs)
            if b.step == a.step + 1 and a.param_norm and b.param_norm is not None
            and math.isfinite(a.param_norm) and math.isfinite(b.param_norm)
        )
        return bounds[int(0.25 * (len(bounds) - 1))] if bounds else None

    def update_ratio_estimate(self, n: int = 20) -> float | None:
        """What sizes a learning-rate back-off: the median measured ``|Δw|/|w|``
        (:meth:`median_update_ratio`), else the bound from the weight norm's change
        (:meth:`norm_change_ratio`)."""
        measured = self.median_update_ratio(n)
        return measured if measured is not None else self.norm_change_ratio(n)

    def median(self, name: str, n: int | None = None) -> float | None:
        vals = sorted(self.series(name, n))
        if not vals:
            return None
        mid = len(vals) // 2
        return vals[mid] if len(vals) % 2 else 0.5 * (vals[mid - 1] + vals[mid])

    def quantile(self, name: str, q: float, n: int | None = None) -> float | None:
        vals = sorted(self.series(name, n))
        if not vals:
            return None
        k = min(len(vals) - 1, max(0, round(q * (len(vals) - 1))))
        return vals[k]

    def of(self, optimizer: str | None) -> History:
        """The steps of one optimizer (a GAN's generator), for a diagnosis of its step; the
        whole history when ``optimizer`` is ``None`` or the run has only one."""
        if optimizer is None or not any(r.optimizer for r in self._records):
            return self
        out = History(maxlen=self.maxlen, layer_window=self.layer_window)
        out._records = deque(r for r in self._records if r.optimizer in (None, optimizer))
        return out

    @classmethod
    def of_records(cls, records: list[StepRecord]) -> History:
        """A history of these records, oldest first (shared, not copied: nothing of theirs
        is trimmed)."""
        out = cls()
        out._records = deque(records)
        return out

    def tail_of(self, optimizer: str, n: int) -> History:
        """The newest ``n`` steps of one optimizer (records with no ``optimizer`` count as its),
        oldest first: what a recovery of a run with several optimizers is judged on — the
        primary's loss, not a policy-gradient loss that is not meant to go down."""
        out = History(maxlen=self.maxlen, layer_window=self.layer_window)
        picked = [r for r in itertools.islice((r for r in reversed(self._records)
                                               if r.optimizer in (None, optimizer)), n)]
        out._records = deque(reversed(picked))
        return out

    def summary(self) -> dict[str, Any]:
        """A few numbers of the healthy history (kept by a guard's ``state_dict``)."""
        return {
            "steps": len(self._records),
            "healthy_steps": len(self.healthy()),
            "median_loss": self.median("loss", 200),
            "median_grad_norm": self.median("grad_norm", 200),
            "median_update_ratio": self.median_update_ratio(),
        }

    def to_list(self) -> list[dict[str, Any]]:
        return [r.to_dict() for r in self._records]
