"""Trends: the numbers the diagnosis rules take from the run's history, read once.

:meth:`Trends.of` summarises a :class:`~nanguard.core.history.History` (the healthy steps before
the failure) into plain numbers — growth of the weight norm, the gradient norm and the loss, the
update/weight ratio, the learning rates seen — so a rule can be tested by writing those numbers
down, without building a history step by step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .history import History

__all__ = ["Growth", "Trends", "clip_threshold"]

#: steps over which the rules look for growth
WINDOW = 8
#: a longer window for the optimizer's second-moment rule
LONG_WINDOW = 32


@dataclass(frozen=True)
class Growth:
    """A scalar over a window of healthy steps: its first and last value, and their ratio."""

    first: float
    last: float
    factor: float

    @classmethod
    def of(cls, t: tuple[float, float, float] | None) -> Growth | None:
        return None if t is None else cls(*t)


@dataclass(frozen=True)
class Trends:
    """What the history says, as numbers (``None``: not enough healthy steps to tell)."""

    #: healthy (finite, not skipped) steps before the failure
    healthy_steps: int = 0
    #: the weight norm over the last 8 healthy steps, and its geometric growth per step
    weights: Growth | None = None
    weights_per_step: float | None = None
    #: the gradient norm over the last 8 and the last 32 healthy steps
    grads: Growth | None = None
    grads_long: Growth | None = None
    #: the loss over the last 8 healthy steps
    loss: Growth | None = None
    #: median ``|Δw|/|w|`` over the healthy steps, and the ratios of the last 8 steps
    median_update_ratio: float | None = None
    recent_update_ratios: tuple[float, ...] = ()
    #: no update measured (a hand-written update): the lower bound of ``|Δw|/|w|`` from the
    #: weight norm's change (:meth:`~nanguard.core.history.History.norm_change_ratio`)
    norm_change_ratio: float | None = None
    #: the gradient norms (last 200 healthy steps) and learning rates (last 500) seen
    grad_norms: tuple[float, ...] = ()
    lrs: tuple[float, ...] = ()
    #: the gradient norm of the last healthy step (``None`` when it was not finite)
    last_grad_norm: float | None = None
    #: ``(step, loss)`` of the first step whose loss was finite
    first_loss: tuple[int, float] | None = None

    @classmethod
    def of(cls, history: History) -> Trends:
        h = history
        healthy = h.healthy()
        ratios = sorted(r.update_ratio for r in healthy if r.update_ratio is not None)
        first = next((r for r in h if r.loss is not None and math.isfinite(r.loss)), None)
        return cls(
            healthy_steps=len(healthy),
            weights=Growth.of(h.growth("param_norm", WINDOW)),
            weights_per_step=h.per_step_growth("param_norm", WINDOW),
            grads=Growth.of(h.growth("grad_norm", WINDOW)),
            grads_long=Growth.of(h.growth("grad_norm", LONG_WINDOW)),
            loss=Growth.of(h.growth("loss", WINDOW)),
            median_update_ratio=ratios[len(ratios) // 2] if ratios else None,
            recent_update_ratios=tuple(
                r.update_ratio for r in h.last(WINDOW) if r.update_ratio is not None
            ),
            norm_change_ratio=None if ratios else h.norm_change_ratio(),
            grad_norms=tuple(h.series("grad_norm", 200)),
            lrs=tuple(h.series("lr", 500)),
            last_grad_norm=next(iter(h.series("grad_norm", 1)), None),
            first_loss=(first.step, float(first.loss)) if first is not None and first.loss is not None else None,
        )

    @property
    def window(self) -> int:
        """The number of steps the 8-step growth figures cover."""
        return min(WINDOW, self.healthy_steps)

    @property
    def weights_grew(self) -> bool:
        """The weight norm grew ≥ 4× over the window, or ≥ 1.5× per step."""
        w = self.weights
        return w is not None and (
            w.factor >= 4 or (self.weights_per_step is not None and self.weights_per_step >= 1.5)
        )

    @property
    def grads_grew(self) -> bool:
        """The gradient norm grew ≥ 10× over the window."""
        return self.grads is not None and self.grads.factor >= 10

    @property
    def big_updates(self) -> bool:
        """The median update/weight ratio is ≥ 0.05 (healthy training: about 1e-3)."""
        return self.median_update_ratio is not None and self.median_update_ratio >= 0.05

    @property
    def schedule_varied(self) -> bool:
        """The learning rate changed from step to step by more than 5 %."""
        return bool(self.lrs) and min(self.lrs) > 0 and max(self.lrs) / min(self.lrs) > 1.05

    @property
    def clip_threshold(self) -> float:
        """A clipping threshold from the calm part of the history."""
        return clip_threshold(self.grad_norms)


def clip_threshold(grad_norms: tuple[float, ...] | list[float]) -> float:
    """A clipping threshold from healthy gradient norms: the 90th percentile of the norms of the
    steps before any blow-up (within 10× of the smallest), to one significant digit; 1.0 when
    there are none."""
    lo = min((v for v in grad_norms if v > 0), default=None)
    if lo is None:
        return 1.0
    calm = sorted(v for v in grad_norms if v <= 10 * lo)
    q = calm[min(len(calm) - 1, round(0.9 * (len(calm) - 1)))]
    exp = math.floor(math.log10(q))
    return float(f"{round(q / 10**exp) * 10**exp:.3g}") or 1.0
