"""Fixes tried before they are applied or offered (framework-free).

After a non-finite step whose cause has a recovery rule (learning rate, exploding gradients,
optimizer state), the step controller lists candidate :class:`Fix` es — a learning-rate factor
sized from the measured update/weight ratio, then ten and a hundred times smaller; clipping at a
threshold from the pre-clip history; a larger ``eps`` — then by 100× at a time down to 1e-10
(an update that swamped the weights reads as a ratio of about 1 whatever its excess) — and asks the framework's backend to try
them: from the newest healthy snapshot, the failing step's batch is run again for a few updates
with the fix applied. A fix is **verified** when every one of those steps stayed finite and the
loss went down (never rising more than 10 % above its start on the way). Recovery applies the first verified fix (the least drastic that worked); a
backend that cannot re-run a step returns no trials, and the fix is applied on trial, judged by
the outcome (:mod:`nanguard.core.outcome`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["TRIAL_STEPS", "Fix", "Trial", "combine_ranks", "lr_candidates"]

#: updates each trial runs from the snapshot on the failing step's batch
TRIAL_STEPS = 3
#: the update/weight ratio the first learning rate tried aims for: the top of the healthy range
#: (about 1e-3 is typical); the trial, then the judged outcome, say whether it was low enough
TARGET_RATIO = 1e-2


@dataclass(frozen=True)
class Fix:
    """One change to try: a learning-rate factor (on top of any earlier back-off), a clipping
    threshold, an ``eps``, a weight decay (where ``lr × weight_decay ≥ 1`` is the root)."""

    lr_factor: float | None = None
    clip_norm: float | None = None
    eps: float | None = None
    weight_decay: float | None = None

    def describe(self) -> str:
        return " + ".join(changes(self.lr_factor, self.clip_norm, self.eps, lr_format=".2g",
                                  weight_decay=self.weight_decay)) or "no change"


def changes(lr_factor: float | None, clip_norm: float | None, eps: float | None,
            lr_format: str = "g", weight_decay: float | None = None) -> list[str]:
    """The words for a change to the update ("learning rate ×0.1", "clip gradients at 3",
    "eps=1e-08", "weight_decay=0.2"), for a fix tried and for the action taken."""
    parts = []
    if weight_decay is not None:
        parts.append(f"weight_decay={weight_decay:g}")
    if lr_factor is not None:
        parts.append(f"learning rate ×{lr_factor:{lr_format}}")
    if clip_norm is not None:
        parts.append(f"clip gradients at {clip_norm:.3g}")
    if eps is not None:
        parts.append(f"eps={eps:g}")
    return parts


@dataclass(frozen=True)
class Trial:
    """What one fix did when tried: ``losses`` on the failing step's batch, before the first
    trial update and after each one (``nan`` where it went non-finite)."""

    fix: Fix
    losses: tuple[float, ...]
    from_step: int | None = None
    note: str | None = None
    lr: float | None = None  # the learning rate the trial's updates used (the first group's)
    grads_finite: bool = True  # False: the gradients of the last loss were not finite

    @property
    def finite(self) -> bool:
        return bool(self.losses) and all(math.isfinite(v) for v in self.losses) and self.grads_finite

    @property
    def fails_at_start(self) -> bool:
        """The step failed at the snapshot's own weights, before any trial update: no fix of
        the update can help — the batch (or a state the script passed in) is what is wrong."""
        return not self.losses or not math.isfinite(self.losses[0]) or (
            len(self.losses) == 1 and not self.grads_finite)

    @property
    def verified(self) -> bool:
        """Every trial step finite, the loss lower after the last update than before, and never
        more than 10 % above where it started in between (an update that overshoots and comes
        back by chance verifies nothing)."""
        if not self.finite or len(self.losses) < 2:
            return False
        start = self.losses[0]
        return self.losses[-1] < start and max(self.losses[1:]) <= start + 0.1 * abs(start)

    def describe(self) -> str:
        if not self.losses:
            return f"{self.fix.describe()}: not tried ({self.note or 'the step could not be re-run'})"
        shown = " → ".join(f"{v:.4g}" for v in self.losses)
        verdict = "verified" if self.verified else ("loss did not go down" if self.finite else
                                                    "gradients not finite" if not self.grads_finite else "not finite")
        return f"{self.fix.describe()}: loss {shown} ({verdict})"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "fix": self.fix.describe(),
            "verified": self.verified,
            "finite": self.finite,
            "grads_finite": self.grads_finite,
            "losses": [v if math.isfinite(v) else str(v) for v in self.losses],
            "from_step": self.from_step,
        }
        if self.lr is not None:
            d["lr"] = self.lr
        for k in ("lr_factor", "clip_norm", "eps", "weight_decay"):
            v = getattr(self.fix, k)
            if v is not None:
                d[k] = v
        if self.note:
            d["note"] = self.note
        return d


def lr_candidates(ratio: float | None, cap: float) -> list[float]:
    """Learning-rate factors to try, largest first: the one that brings the measured update/
    weight ``ratio`` to :data:`TARGET_RATIO` (at most ``cap``), then 10× and 100× smaller."""
    first = cap
    if ratio is not None and math.isfinite(ratio) and ratio > 0:
        first = min(cap, TARGET_RATIO / ratio)
    first = float(f"{max(first, 1e-12):.2g}")
    return [first, float(f"{first / 10:.2g}"), float(f"{first / 100:.2g}")]


def combine_ranks(per_rank: Sequence[list[Trial] | None]) -> list[Trial] | None:
    """One list of trials for every rank of a distributed run, from each rank's own (each tried
    every fix on its own part of the failing step): ``None`` if a rank could not re-run the step;
    else, fix by fix, a rank's trial where that fix was not verified (a fix is verified only if it
    was on every rank), or the losses summed over the ranks (the whole step's loss), up to the
    first verified. Every rank gets the same list, so every rank applies the same fix."""
    if not per_rank or any(t is None for t in per_rank):
        return None
    lists = [t for t in per_rank if t is not None]
    out: list[Trial] = []
    for i in range(min(len(t) for t in lists)):
        these = [t[i] for t in lists]
        bad = next((t for t in these if not t.verified), None)
        if bad is not None:
            out.append(bad)
            continue
        n = min(len(t.losses) for t in these)
        out.append(replace(these[0], losses=tuple(math.fsum(t.losses[j] for t in these) for j in range(n))))
    # as one process would have stopped: at the first fix that worked, or at a step that failed
    # before any update
    end = next((i for i, t in enumerate(out) if t.verified or t.fails_at_start), len(out) - 1)
    return out[: end + 1]
