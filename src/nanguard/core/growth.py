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
second half) is more than :data:`WORSE` above its median over as many steps before the raise,
or the updates swamp the weights, the raise is undone and the next one waits twice as long. The
raise is tried from a snapshot taken as it begins: an undo for a non-finite step, a loss held
above its level, or a jump above where the run started rolls back to it (the weights carry the
damage). The history's ``lr``
shows the factor over time; each change is one line on stderr and one entry of
``RecoveryState.lr_changes`` (the run log's ``outcome.lr_changes``, and the summary's factor in force).
"""

from __future__ import annotations

from dataclasses import dataclass

from .history import History
from .outcome import STUCK_RATIO, Level, _median, healthy_now

__all__ = ["GROWTH", "GROW_EVERY", "Regrowth"]

#: healthy steps with the factor unchanged before it is raised
GROW_EVERY = 50
#: each raise multiplies the factor by this (GradScaler's growth factor)
GROWTH = 2.0
#: a raise is kept only if the loss over the second half of its probation is no more than this
#: much (relative) above its median over as many steps before the raise: a higher learning rate
#: that trains worse is no gain (a band of "within 2×" kept raises that doubled the loss)
WORSE = 0.05


@dataclass
class Regrowth:
    """When the back-off in force may grow back (see the module docstring). One per controller;
    ``step_ended`` is called at the end of every step with a back-off in force."""

    every: int = GROW_EVERY
    #: the step at which the factor last changed (``None``: no back-off seen yet)
    last_change: int | None = None
    #: a raise on probation: (its step, the factor before it, the loss ceiling before it, the
    #: median loss before it)
    probation: tuple[int, float, float | None, float | None] | None = None
    #: why the last raise was undone, when its steps left the weights worse than before it:
    #: ``"nonfinite"``, ``"rose"`` (the loss held above its level before the raise), ``"jump"``
    #: (one loss ten times the ceiling: damage only when above where the run started — the
    #: controller asks) — the controller rolls back to the snapshot taken as the raise began
    damaged: str | None = None
    #: a raise began: the adapter's next snapshot opportunity keeps the state it is tried from
    wants_snapshot: bool = False

    def backed_off(self, step: int) -> None:
        """The policy changed the factor (a rollback with a back-off, an escalation)."""
        self.last_change, self.probation = step, None

    def step_ended(self, history: History, lr_scale: float, judging: bool) -> tuple[float, str] | None:
        """The factor to switch to now, and why; ``None``: keep it."""
        if not len(history) or self.last_change is None:
            return None
        rec = history[-1]
        if self.probation is not None:
            return self._judge(history, rec.step)
        if (lr_scale >= 1.0 or judging or not rec.finite or rec.step - self.last_change < self.every
                or not healthy_now(history)):
            return None
        new = min(1.0, lr_scale * GROWTH)
        self.probation = (rec.step, lr_scale, Level.of(history).ceiling,
                          _median(history.series("loss", max(1, self.every // 2))))
        self.last_change = rec.step
        return new, f"{self.every} healthy steps since it last changed"

    def _judge(self, history: History, step: int) -> tuple[float, str] | None:
        """A raise on probation: undone at once on a non-finite step or a loss ten times its
        ceiling; at the end of the probation, when the loss over its second half sits above the
        ceiling, or the updates swamp the weights."""
        assert self.probation is not None
        at, before, ceiling, held = self.probation
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
            if held is not None and loss is not None and loss > held + WORSE * abs(held):
                why = f"the loss rose to {loss:.4g}, above the {held:.4g} it held at before the raise"
                self.damaged = "rose"
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
