"""Fixes several rules share: a lower learning rate, clipping, scaled targets."""

from __future__ import annotations

from ..case import Case
from ._fmt import nice_lr, num

__all__ = ["explode_fixes", "lr_fixes", "recurrent", "scale_hint"]

#: a loss this large at the first step means the targets (or inputs) were never scaled
LARGE_FIRST_LOSS = 1e6


def lr_fixes(case: Case) -> list[str]:
    """A lower learning rate (or a lower peak of the schedule that sets it), and clipping."""
    ctx, say, trend = case.ctx, case.say, case.trend
    lr = ctx.lr
    top = max([*trend.lrs, lr or 0.0])
    kw = {
        "opt": case.opt,
        "lr": nice_lr(lr / 4) if lr else "1e-3",
        "was": f"  # was {num(lr)}" if lr else "",
        "clip": f"{trend.clip_threshold:g}",
        "sched": ctx.scheduler or "",
        "peak": nice_lr(top / 4),
        "top": num(top),
    }
    book = say.lr_fixes
    if ctx.scheduler in ("OneCycleLR", "CyclicLR") and say.lr_fixes_cyclic is not None:
        book = say.lr_fixes_cyclic
    elif ctx.scheduler is not None and say.lr_fixes_scheduled is not None:
        book = say.lr_fixes_scheduled
    elif ctx.scheduler is None and trend.schedule_varied and say.lr_fixes_varying is not None:
        # the learning rate changed from step to step: a schedule (perhaps written by hand,
        # assigning param_group["lr"]) would overwrite a new optimizer's lr — cap its peak
        book = say.lr_fixes_varying
    return [t.format(**kw) for t in book]


def explode_fixes(case: Case) -> list[str]:
    """Clipping at a threshold from the calm part of the history, and a lower learning rate."""
    lr = case.ctx.lr
    kw = {
        "opt": case.opt,
        "clip": f"{case.trend.clip_threshold:g}",
        "lr": nice_lr(lr / 4) if lr else "1e-3",
    }
    fixes = [t.format(**kw) for t in case.say.explode_fixes]
    if case.say.recurrent_fix is not None and recurrent(case):
        fixes.append(case.say.recurrent_fix)
    return fixes


def recurrent(case: Case) -> bool:
    """Does the finding come from a recurrent layer (by its module, type or autograd node)?"""
    ev = case.ev
    text = " ".join(str(x) for x in (ev.module, ev.module_type, ev.grad_fn, ev.op) if x).lower()
    return any(k in text for k in ("rnn", "lstm", "gru", "recurren", "cell"))


def scale_hint(case: Case) -> tuple[str, str] | None:
    """(evidence, fix) when the run's loss was already huge at its first step: no learning rate
    trains well on targets in the hundreds of thousands; scaling them is the fix that works."""
    first = case.trend.first_loss
    if first is None or first[0] > 1 or abs(first[1]) < LARGE_FIRST_LOSS:
        return None
    return (
        f"the loss was already {num(first[1])} at step {first[0]}: the targets (or the inputs) are "
        "on a large scale, which makes every update large",
        case.say.scale_targets,
    )
