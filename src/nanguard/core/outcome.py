"""The outcome of a recovery, judged on the run itself (framework-free).

A run that met a non-finite value and went on is not "recovered" because it went on: only when its
loss came back to the level of its own healthy history. The step controller starts an
:class:`OutcomeJudge` when the policy acted on a non-finite step (skipped it, dropped its batch,
rolled back), feeds it every step's history record after that (at the end of the step), and the
judge decides once per episode:

* ``recovered`` — at the end of the ``window`` healthy steps after the last event, the loss (the
  median of the last ``min_steps``) is back under the healthy ceiling and the updates no longer
  swamp the weights (decided at the end of the window, not when noise first dips under it);
* ``not-recovered`` — it is not: the numbers say how far off it is (loss before the event, loss
  now, update/weight ratio now). After a bad batch (dropped, or its update skipped: the weights
  never took it) the run only has to be back within its own band before the event, and a band
  of fewer than :data:`SHORT` steps is no level to fail a run by: ``unjudged``, said so. A run that ends inside the window is judged on what was seen — ``unjudged`` when that
is fewer than ``min_steps`` healthy steps.

The same signals decide whether a snapshot may be kept as a rollback target
(:func:`healthy_now`): only a step that is healthy by them is "last known good".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .history import History, StepRecord

__all__ = ["STUCK_RATIO", "Level", "Outcome", "OutcomeJudge", "healthy_now"]

#: an update/weight ratio above this means the updates still swamp the weights (healthy ≈ 1e-3)
STUCK_RATIO = 0.1
#: healthy losses the level is taken from (the most recent ones before the event)
LEVEL_STEPS = 20
#: fewer healthy steps than this before the event: the run must get below its level
SHORT = 10


def _median(vals: list[float]) -> float | None:
    if not vals:
        return None
    s = sorted(vals)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else 0.5 * (s[mid - 1] + s[mid])


@dataclass(frozen=True)
class Level:
    """The run's healthy level before an event: the lower quartile of the loss over its last
    healthy steps and the ceiling a loss must come back under (``level + max(|level|, 3·noise)``:
    within 2× for a positive loss, more for a noisy one; the level itself after fewer than
    :data:`SHORT` healthy steps); the median update/weight ratio."""

    loss: float | None
    ceiling: float | None
    ratio: float | None
    steps: int
    #: the highest of those healthy losses: the top of the run's own band before the event
    top: float | None = None

    @classmethod
    def of(cls, history: History) -> Level:
        losses = history.series("loss", LEVEL_STEPS)
        ratios = [r.update_ratio for r in history.healthy(LEVEL_STEPS) if r.update_ratio is not None]
        level = ceiling = None
        if losses:
            # the lower quartile: a run that diverged over its last few healthy steps is judged
            # against where it was before that, not against the divergence
            s = sorted(losses)
            level = s[int(0.25 * (len(s) - 1))]
            if len(s) >= SHORT:
                # the noise, from the lower half only (the divergence is in the upper one)
                spread = s[len(s) // 2] - s[int(0.1 * (len(s) - 1))]
                ceiling = level + max(abs(level), 3.0 * spread, 1e-12)
            else:
                # a few steps are no healthy stretch (a run that diverged from its start): coming
                # back means learning something — getting clearly below where it started
                ceiling = level - 0.05 * abs(level)
        return cls(level, ceiling, _median([r for r in ratios if math.isfinite(r)]), len(losses),
                   max(losses) if losses else None)

    def ratio_ceiling(self) -> float:
        """The update/weight ratio the run must come back under."""
        if self.ratio is not None and self.steps >= 5:
            return max(STUCK_RATIO, 2.0 * self.ratio)
        return STUCK_RATIO


@dataclass
class Outcome:
    """One episode: from the first event after a healthy stretch until it is decided."""

    event_step: int
    level: Level
    window: int
    status: str = "judging"  # "judging", "recovered", "not-recovered", "unjudged"
    losses: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)
    decided_step: int | None = None
    reason: str = ""
    events: int = 1
    #: the first event was a bad batch (dropped, or skipped with its update): the weights never
    #: took it, so the run is back when its loss is within its own band again
    bad_batch: bool = False

    @property
    def ceiling(self) -> float | None:
        """The loss the run must come back under: the level's ceiling — after a bad batch, at
        least the top of the run's own band before the event (a noisy run's losses go on
        moving within it; a short history is no stretch to improve on)."""
        c, top = self.level.ceiling, self.level.top
        if self.bad_batch and c is not None and top is not None:
            return max(c, top)
        return c

    @property
    def loss_now(self) -> float | None:
        return _median(self.losses[-5:])

    @property
    def ratio_now(self) -> float | None:
        return _median(self.ratios[-5:])

    def met(self, min_steps: int) -> bool:
        """Is the run back at its healthy level (on the steps seen since the event)?"""
        ceiling = self.ceiling
        if len(self.losses) < min_steps or ceiling is None:
            return False
        now = self.loss_now
        if now is None or now > ceiling:
            return False
        r = self.ratio_now
        return r is None or r <= self.level.ratio_ceiling()

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "event_step": self.event_step,
            "decided_step": self.decided_step,
            "window": self.window,
            "events": self.events,
            "loss_before": self.level.loss,
            "loss_ceiling": self.ceiling,
            "loss_now": self.loss_now,
            "update_ratio_before": self.level.ratio,
            "update_ratio_now": self.ratio_now,
            "healthy_steps_since": len(self.losses),
            "reason": self.reason,
        }


@dataclass
class OutcomeJudge:
    """Judges every episode of a run (see the module docstring). ``window``: healthy steps after
    the last event within which the loss must come back; ``min_steps``: healthy steps it must
    stay there (the median of that many is compared)."""

    window: int = 50
    min_steps: int = 10
    episodes: list[Outcome] = field(default_factory=list)

    @property
    def current(self) -> Outcome | None:
        return self.episodes[-1] if self.episodes else None

    @property
    def judging(self) -> bool:
        cur = self.current
        return cur is not None and cur.status == "judging"

    def acted(self, step: int, history: History, bad_batch: bool = False) -> None:
        """The policy acted on a non-finite step (before the run went on); ``bad_batch``: the
        step's batch was the cause (its data held the non-finite value, or it failed at the
        healthy weights whatever the fix). A new episode starts after a healthy stretch; an
        event while one is open restarts its window, keeping the level from before its first
        event."""
        cur = self.current
        if cur is not None and cur.status == "judging":
            cur.events += 1
            cur.event_step = step
            cur.losses.clear()
            cur.ratios.clear()
            return
        if cur is not None and cur.status == "not-recovered" and not cur.met(self.min_steps):
            # still off its level since the last verdict: the same episode goes on
            cur.status, cur.decided_step, cur.events = "judging", None, cur.events + 1
            cur.event_step = step
            cur.losses.clear()
            cur.ratios.clear()
            return
        self.episodes.append(Outcome(step, Level.of(history), self.window, bad_batch=bad_batch))

    def observe(self, rec: StepRecord) -> Outcome | None:
        """A step ended (its history record): returns the episode when this step decided it."""
        cur = self.current
        if cur is None or cur.status != "judging" or not rec.finite or rec.skipped or rec.step <= cur.event_step:
            return None
        if rec.loss is not None and math.isfinite(rec.loss):
            cur.losses.append(rec.loss)
        r = rec.update_ratio
        if r is not None and math.isfinite(r):
            cur.ratios.append(r)
        if cur.level.ceiling is None:
            cur.status, cur.decided_step = "unjudged", rec.step
            cur.reason = "no loss was seen before the event: the outcome cannot be judged"
            return cur
        if len(cur.losses) < self.window:
            return None
        if cur.met(self.min_steps):
            cur.status, cur.decided_step = "recovered", rec.step
            cur.reason = f"the loss was back at the run's healthy level {len(cur.losses)} healthy steps after the event"
        else:
            self._not_recovered(cur, rec.step, f"{self.window} healthy steps after the event the loss "
                                "had not come back to the run's healthy level")
        return cur

    def ended(self, step: int, tail: list[float] | None = None) -> Outcome | None:
        """The run ended: an episode still being judged is decided on what was seen; one
        decided ``recovered`` is held to it to the end — when the median of ``tail`` (the run's
        last healthy losses, :data:`LEVEL_STEPS` of them, all after the verdict) sits above its
        ceiling again, the run relapsed: ``not-recovered``."""
        cur = self.current
        if cur is not None and cur.status == "recovered" and tail:
            self._relapsed(cur, step, tail)
        if cur is None or cur.status != "judging":
            return cur
        if cur.level.ceiling is None:
            cur.status, cur.decided_step = "unjudged", step
            cur.reason = "no loss was seen before the event: the outcome cannot be judged"
        elif not cur.losses:
            cur.status, cur.decided_step = "unjudged", step
            cur.reason = "the run ended at the last event: no healthy step after it to judge by"
        elif len(cur.losses) < self.min_steps:
            n = len(cur.losses)
            cur.status, cur.decided_step = "unjudged", step
            cur.reason = (f"the run ended {n} healthy step{'s' if n != 1 else ''} after the last event: "
                          f"too few to judge by ({self.min_steps} needed)")
        elif cur.met(self.min_steps):
            cur.status, cur.decided_step = "recovered", step
            cur.reason = f"the loss was back at the run's healthy level when the run ended ({len(cur.losses)} healthy steps after the last event)"
        else:
            n = len(cur.losses)
            self._not_recovered(cur, step, f"the run ended {n} healthy step{'s' if n != 1 else ''} "
                                "after the last event, before its loss came back to its healthy level")
        return cur

    def _relapsed(self, cur: Outcome, step: int, tail: list[float]) -> None:
        """A recovered episode whose loss, over the run's last healthy steps, is off its level
        again (a back-off that was not enough: the loss swings far above where it came back to)."""
        now, ceiling = _median(tail), cur.ceiling
        if (cur.decided_step is None or step - cur.decided_step < len(tail) or len(tail) < self.min_steps
                or now is None or ceiling is None or now <= ceiling):
            return
        cur.status, cur.decided_step = "not-recovered", step
        cur.reason = (f"the loss came back to the run's healthy level, then left it again: over the "
                      f"last {len(tail)} healthy steps its median is {now:.4g}, above the healthy "
                      f"ceiling {ceiling:.4g} (loss {cur.level.loss:.4g} before the event)")

    def _not_recovered(self, cur: Outcome, step: int, why: str) -> None:
        if cur.bad_batch and cur.level.steps < SHORT:
            # a few noisy steps before a dropped batch are no level to hold a run to: say so,
            # never a failure
            n = cur.level.steps
            cur.status, cur.decided_step = "unjudged", step
            cur.reason = (f"only {n} healthy step{'s' if n != 1 else ''} before the event: too few to know "
                          f"the run's level ({SHORT} needed); the loss is {cur.loss_now:.4g} now, "
                          f"{cur.level.loss:.4g} to {cur.level.top:.4g} before")
            return
        cur.status, cur.decided_step = "not-recovered", step
        parts = [why]
        if cur.level.loss is not None and cur.loss_now is not None:
            parts.append(f"loss {cur.level.loss:.4g} before the event, {cur.loss_now:.4g} now "
                         f"(healthy ceiling {cur.ceiling:.4g})")
        if cur.ratio_now is not None:
            parts.append(f"update/weight ratio {cur.ratio_now:.3g} now (healthy ≈ 1e-3)")
        cur.reason = "; ".join(parts)

    def verdict(self) -> Outcome | None:
        """The run's outcome: the worst episode (a not-recovered one), else the last."""
        bad = [o for o in self.episodes if o.status == "not-recovered"]
        return bad[-1] if bad else self.current

    def state_dict(self) -> list[dict[str, Any]]:
        return [o.to_dict() for o in self.episodes]


def healthy_now(history: History, judge: OutcomeJudge | None = None) -> bool:
    """May the weights after the newest step be kept as "last known good"? Not while an episode
    is open and off its level, nor when the updates swamp the weights, the weights or gradient
    norm grow geometrically, or the loss sits far above its recent level."""
    if judge is not None and judge.judging:
        cur = judge.current
        assert cur is not None
        if not cur.met(judge.min_steps):
            return False
    recent = history.healthy(8)
    if not recent:
        return True
    r = recent[-1].update_ratio
    if r is not None and math.isfinite(r) and r > STUCK_RATIO:
        return False
    g = history.per_step_growth("param_norm", 8)
    if g is not None and g > 1.05:
        return False
    gg = history.per_step_growth("grad_norm", 8)
    if gg is not None and gg > 1.5:
        return False
    level = Level.of(history)
    last = recent[-1].loss
    return not (level.ceiling is not None and last is not None and math.isfinite(last)
                and last > level.ceiling)
