"""A learning-rate back-off that grows back, as a dynamic loss scale does (framework-free).

``recover`` backs the learning rate off by the factor a trial verified on the failing step — a
factor sized to stop the divergence, often far below what the run can train at. Kept for the rest
of the run, it leaves a run that learns slowly and is then called recovered. As ``GradScaler``
grows its scale back after ``growth_interval`` steps without an overflow, the step controller asks
:class:`Regrowth` at the end of every step: after :data:`GROW_EVERY` healthy steps since the
factor last changed (a back-off, or a raise), with no recovery being judged and the run healthy
by the snapshot signals (:func:`~nanguard.core.outcome.healthy_now`), the factor is doubled (at
most back to 1). Each raise is on probation for the next ``every`` steps: if a step goes
non-finite or the loss jumps tenfold, or at the end the loss (the median of the probation's
second half) is more than :data:`WORSE` above its median over as many steps before the raise
(and more than the loss's noise can move that median),
or the updates swamp the weights, the raise is undone and the next one waits twice as long. The
raise is tried from a snapshot taken as it begins: an undo for a non-finite step, a loss held
above its level and above every loss of the 20 healthy steps before the raise, or a jump above
where the run started rolls back to it (the weights carry the damage; a loss held above its
level within that band is undone without losing the probation's steps). A raise kept through its probation can still be too much later on: a run whose loss
climbs again at a constant back-off with no NaN (an actor-critic's critic at 1e17) *relapsed* —
the median of its last :data:`RELAPSE_STEPS` losses :data:`RELAPSE` band widths above the level
it held when the back-off last grew, and above where the run started: the factor is halved
(the last raise undone, never raised back to where it relapsed) and the controller rolls back
to the snapshot before the newest, at most :data:`MAX_RELAPSES` times. The history's ``lr``
shows the factor over time; each change is one line on stderr and one entry of
``RecoveryState.lr_changes`` (the run log's ``outcome.lr_changes``, and the summary's factor in force).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .history import History
from .outcome import SHORT, STUCK_RATIO, Level, _median, healthy_now

__all__ = ["GROWTH", "GROW_EVERY", "MAX_RELAPSES", "RELAPSE", "RELAPSE_STEPS", "Regrowth"]

#: healthy steps with the factor unchanged before it is raised
GROW_EVERY = 50
#: each raise multiplies the factor by this (GradScaler's growth factor)
GROWTH = 2.0
#: a raise is kept only if the loss over the second half of its probation is no more than this
#: much (relative) above its median over as many steps before the raise: a higher learning rate
#: that trains worse is no gain (a band of "within 2×" kept raises that doubled the loss)
WORSE = 0.05
#: a relapse: the loss's median over this many steps ...
RELAPSE_STEPS = 10
#: ... at least this many band widths (the level's ceiling minus the level) above the level the
#: run held when the back-off last grew (a steady positive loss: 11× it)
RELAPSE = 10.0
#: relapses acted on in one run; after them the outcome judge says what became of it
MAX_RELAPSES = 4


def _noise(losses: list[float]) -> float:
    """How far the median of a window of ``len(losses)`` losses can rise on noise alone: twice
    the standard error of the difference of two such medians (σ from the interquartile range,
    σ ≈ IQR / 1.35; a median's standard error ≈ 1.25 σ / √n). A noisy loss (a small regression
    whose batches range over ×3) moves its median by more than :data:`WORSE` from window to
    window; a raise undone for that threw away 200 steps of a run that trained as well."""
    n = len(losses)
    if n < 4:
        return 0.0
    s = sorted(losses)
    iqr = s[(3 * (n - 1)) // 4] - s[(n - 1) // 4]
    return 2.0 * math.sqrt(2.0) * 1.25 * (iqr / 1.35) / math.sqrt(n)


@dataclass
class Regrowth:
    """When the back-off in force may grow back (see the module docstring). One per controller;
    ``step_ended`` is called at the end of every step with a back-off in force."""

    every: int = GROW_EVERY
    #: the step at which the factor last changed (``None``: no back-off seen yet)
    last_change: int | None = None
    #: a raise on probation: (its step, the factor before it, the loss ceiling before it, the
    #: median loss before it, the rise in that median the loss's noise alone can make, the
    #: highest loss of the healthy steps before it)
    probation: tuple[int, float, float | None, float | None, float, float | None] | None = None
    #: why the last raise was undone, when its steps left the weights worse than before it:
    #: ``"nonfinite"``, ``"rose"`` (the loss held above its level before the raise), ``"jump"``
    #: (one loss ten times the ceiling: damage only when above where the run started — the
    #: controller asks) — the controller rolls back to the snapshot taken as the raise began
    damaged: str | None = None
    #: a raise began: the adapter's next snapshot opportunity keeps the state it is tried from
    wants_snapshot: bool = False
    #: the healthy level (loss, ceiling) the run held when the back-off last grew: what a
    #: relapse is measured from
    reference: tuple[float, float] | None = None
    relapses: int = 0
    #: the factor a relapse came at: never raised back to it
    cap: float = math.inf

    def backed_off(self, step: int) -> None:
        """The policy changed the factor (a rollback with a back-off, an escalation)."""
        self.last_change, self.probation = step, None

    def step_ended(self, history: History, lr_scale: float, judging: bool,
                   start: float | None = None) -> tuple[float, str] | None:
        """The factor to switch to now, and why; ``None``: keep it. ``start``: where the run
        started (its first loss): a relapse is a loss above it."""
        if not len(history) or self.last_change is None:
            return None
        rec = history[-1]
        if self.probation is not None:
            return self._judge(history, rec.step)
        self.damaged = None
        relapse = self._relapse(history, lr_scale, start)
        if relapse is not None:
            return relapse
        new = min(1.0, lr_scale * GROWTH)
        if (new >= self.cap or lr_scale >= 1.0 or judging or not rec.finite
                or rec.step - self.last_change < self.every or not healthy_now(history)):
            return None
        level = Level.of(history)
        if level.loss is not None and level.ceiling is not None and level.steps >= SHORT:
            self.reference = (level.loss, level.ceiling)
        before = history.series("loss", max(1, self.every // 2))
        self.probation = (rec.step, lr_scale, level.ceiling, _median(before), _noise(before), level.top)
        self.last_change = rec.step
        return new, f"{self.every} healthy steps since it last changed"

    def relapse_bar(self) -> float | None:
        """The loss above which the run has left the level it held when the back-off last grew
        (``None``: it never grew)."""
        if self.reference is None:
            return None
        level, ceiling = self.reference
        return level + RELAPSE * max(ceiling - level, 1e-12)

    def _relapse(self, history: History, lr_scale: float, start: float | None) -> tuple[float, str] | None:
        """A kept raise the run no longer bears: its loss climbed back far above its level."""
        bar = self.relapse_bar()
        if bar is None or self.relapses >= MAX_RELAPSES or lr_scale <= 0.0:
            return None
        # only steps since the factor last changed (after a relapse's rollback, the climb it
        # undid is still in the history)
        losses = [r.loss for r in history.healthy(RELAPSE_STEPS) if r.step > (self.last_change or 0)
                  and r.loss is not None and math.isfinite(r.loss)]
        now = _median(losses)
        if len(losses) < RELAPSE_STEPS or now is None or now <= bar or (start is not None and now <= start):
            return None
        assert self.reference is not None
        self.relapses += 1
        self.cap = min(self.cap, lr_scale)
        self.damaged = "relapse"
        self.last_change = history[-1].step
        self.every *= 2
        return (lr_scale / GROWTH,
                f"relapsed: the loss's median over the last {len(losses)} steps is {now:.4g}, far above "
                f"the {self.reference[0]:.4g} it held at when the back-off last grew")

    def off_level(self, loss: float | None) -> bool:
        """Is this loss above the relapse bar (no state to keep as "last known good")?"""
        bar = self.relapse_bar()
        return bar is not None and loss is not None and loss > bar

    def _judge(self, history: History, step: int) -> tuple[float, str] | None:
        """A raise on probation: undone at once on a non-finite step or a loss ten times its
        ceiling; at the end of the probation, when the loss over its second half sits above the
        ceiling, or the updates swamp the weights."""
        assert self.probation is not None
        at, before, ceiling, held, noise, top = self.probation
        since = [r for r in reversed(list(history.newest(step - at))) if r.step > at]
        losses = [r.loss for r in since if r.finite and r.loss is not None]
        why = None
        self.damaged = None
        if any(not r.finite for r in since):
            why, self.damaged = "a step went non-finite", "nonfinite"
        elif ceiling is not None and losses and ceiling > 0 and losses[-1] > 10 * ceiling:
            why = f"the loss jumped to {losses[-1]:.4g}, ten times the {ceiling:.4g} it kept before"
            self.damaged = "jump"
        elif step - at >= self.every:
            loss = _median(losses[len(losses) // 2:])
            ratio = _median([r.update_ratio for r in since if r.update_ratio is not None])
            if held is not None and loss is not None and loss > held + max(WORSE * abs(held), noise):
                why = f"the loss rose to {loss:.4g}, above the {held:.4g} it held at before the raise"
                # the weights carry damage when the loss left the band it kept before the raise
                # (above its highest loss there); a rise within that band is undone, not rolled back
                self.damaged = "rose" if top is None or loss > top else None
            elif ratio is not None and ratio > STUCK_RATIO:
                why = f"the updates swamp the weights (update/weight ratio {ratio:.2g})"
            else:
                self.probation, self.last_change = None, step  # kept: the next raise waits
                return None  # ``every`` steps from here
        if why is None:
            return None
        self.probation, self.last_change = None, step
        self.every *= 2
        return before, f"undone: {why}"
