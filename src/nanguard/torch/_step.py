"""The torch step in progress: what the hooks gather between a step's first op and its end.

One object per guard, emptied when a step ends (:meth:`TorchStep.reset`). Where the step is —
outside the optimizer, inside ``optimizer.step()``, inside its closure — is an explicit
:class:`Where`, moved only by :meth:`enter`/:meth:`leave`, which raise
:class:`~nanguard.core.step.StepOrderError` on an impossible order (leaving a closure that was
never entered) instead of clamping a counter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

from ..core.step import StepOrderError
from .watch import NormCheck

__all__ = ["TorchStep", "Where"]


class Where(Enum):
    OUTSIDE = "outside"  # forward, backward, the script's own code
    OPTIMIZER = "optimizer"  # inside optimizer.step(), between its pre- and post-step hooks
    CLOSURE = "closure"  # inside the closure optimizer.step(closure) calls (LBFGS, Lightning)


_MOVES = {
    (Where.OUTSIDE, Where.OPTIMIZER), (Where.OPTIMIZER, Where.CLOSURE),
    (Where.CLOSURE, Where.OPTIMIZER), (Where.OPTIMIZER, Where.OUTSIDE),
}


@dataclass(slots=True)
class TorchStep:
    """The losses, clip norms and sinks of the step in progress, and where it is."""

    where: Where = Where.OUTSIDE
    #: the roots of the step's backward passes (its losses), detached
    losses: list[torch.Tensor] = field(default_factory=list)
    #: the losses a GradScaler scaled, unscaled
    unscaled: list[torch.Tensor] = field(default_factory=list)
    #: total norms clip_grad_norm_ returned (an overflow it swallowed is the only trace)
    clip_norms: list[torch.Tensor] = field(default_factory=list)
    #: further values that must stay finite, made by recorded events: (ref, description)
    sinks: list[Any] = field(default_factory=list)
    #: the check of this step's gradients, once made
    check: NormCheck | None = None
    #: how many of ``check.losses`` are backward roots (the rest are clip norms)
    n_losses: int = 0
    #: the optimizer of this step calls a closure (checked after each call)
    closure: bool = False
    #: the back-off was applied to this step's update already (a closure runs several checks)
    settings_applied: bool = False
    #: the recorder was paused for this step's optimizer (released by the post-step hook)
    held: bool = False
    #: the loss of steps counted at backward() before the optimizer was known (joins its step)
    carry_loss: float | None = None
    #: under torch.distributed: the mean of every rank's loss, from the step's agreement
    ranks_loss: float | None = None

    def enter(self, where: Where) -> None:
        if (self.where, where) not in _MOVES:
            raise StepOrderError(f"nanguard: the step moved from {self.where.value} to {where.value}: "
                                 "an error inside nanguard, please report it")
        self.where = where

    @property
    def in_optimizer(self) -> bool:
        """Inside ``optimizer.step()`` but not in its closure: the optimizer's own autograd calls
        are not the step's backward."""
        return self.where is Where.OPTIMIZER

    def restart(self) -> None:
        """A closure call starts the step's forward and backward again."""
        self.losses, self.unscaled, self.clip_norms, self.sinks = [], [], [], []

    def reset(self) -> None:
        """The step ended: nothing of it is left for the next."""
        self.where = Where.OUTSIDE
        self.restart()
        self.check = None
        self.n_losses = 0
        self.ranks_loss = None
        self.closure = self.settings_applied = self.held = False

    def loss(self, check: NormCheck | None) -> float | None:
        """The step's loss for the history: the sum of its backward roots (or the carried loss
        of the backward() calls counted before the optimizer was known); under torch.distributed
        the mean over the ranks."""
        n = self.n_losses if check is not None else 0
        loss = math.fsum(check.losses[:n]) if check is not None and n else self.carry_loss
        self.carry_loss = None
        return self.ranks_loss if self.ranks_loss is not None and n else loss

    def pre_clip(self, check: NormCheck | None) -> float | None:
        """The largest total norm ``clip_grad_norm_`` returned this step (from before it
        clipped: the evidence), ``None`` when the script did not clip."""
        pre = [v for v in (check.losses[self.n_losses:] if check is not None else []) if v == v]
        return max(pre) if pre else None
