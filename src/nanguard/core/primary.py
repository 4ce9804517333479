"""Which steps a recovery is judged on (framework-free).

A run with several optimizers (a GAN's two, an actor-critic's two) writes one history record per
optimizer step. The outcome of a recovery, the growth of a back-off and the "last known good"
test read the loss of the *primary* — the optimizer of the run's first step (a critic's squared
error, which goes down) — not the other's (a policy-gradient loss swings over orders of magnitude
and is not meant to go down). The step controller feeds :class:`PrimarySteps` every record at
the end of its step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .history import History, StepRecord

__all__ = ["PrimarySteps"]


@dataclass
class PrimarySteps:
    """The primary optimizer's name, whether another one stepped too, and the run's first finite
    loss (where training started)."""

    name: str | None = None
    several: bool = False
    first_loss: float | None = None
    first_step: int | None = None

    def note(self, rec: StepRecord) -> None:
        """A step ended (its record)."""
        if rec.optimizer is not None and rec.optimizer != self.name:
            if self.name is None:
                self.name = rec.optimizer
            else:
                self.several = True
        if (self.first_loss is None and self.owns(rec) and rec.finite and rec.loss is not None
                and math.isfinite(rec.loss)):
            self.first_loss, self.first_step = rec.loss, rec.step

    def owns(self, rec: StepRecord) -> bool:
        """Is this the primary's step (every step, with one optimizer)?"""
        return not self.several or rec.optimizer in (None, self.name)

    def of(self, history: History, n: int) -> History:
        """The primary's newest ``n`` steps (the whole history, with one optimizer)."""
        if not self.several or self.name is None:
            return history
        return history.tail_of(self.name, n)

    def up_to(self, history: History, restored: int | None, n: int) -> History:
        """The primary's newest ``n`` steps an episode's level is taken from: after a rollback
        (``restored``: the step of the state the run went back to), those up to that state — the
        steps after it were the divergence (a BatchNorm classifier's loss climbed to 1e32 over 50
        finite steps before its first NaN, and "back at its healthy level" was judged against
        that climb); else the newest."""
        if restored is None:
            return self.of(history, n)
        before = [r for r in history if r.step <= restored and self.owns(r)]
        return History.of_records(before[-n:]) if before else self.of(history, n)

    def above_start(self, history: History) -> bool:
        """Is the primary's newest loss above where the run started, or not finite? (After a
        raised learning rate made the loss jump: the weights carry the damage. A jump that stays
        below — a converged classifier's 1e-4 meeting a batch at 3e-3 — does not.)"""
        last = self.of(history, 1)
        loss = last[-1].loss if len(last) else None
        start = self.start(history)
        return loss is None or not math.isfinite(loss) or start is None or loss > start

    def start(self, history: History) -> float | None:
        """Where the run started: its first finite loss seen, or the history's oldest (records
        the controller was given at a resume were never fed to it step by step)."""
        oldest = next((r for r in history if self.owns(r) and r.finite and r.loss is not None
                       and math.isfinite(r.loss)), None)
        if oldest is not None and (self.first_step is None or oldest.step < self.first_step):
            return oldest.loss
        return self.first_loss
