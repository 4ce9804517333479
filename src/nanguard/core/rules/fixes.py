"""Fixes several rules share: a lower learning rate, clipping, scaled targets."""

from __future__ import annotations

import math

from ..case import Case
from ..flags import Flag, lr_flag
from ..ops import ADAPTIVE_OPTIMIZERS
from ..trials import TARGET_RATIO, Trial
from ._fmt import nice_lr, num

__all__ = ["explode_fixes", "lr_fixes", "recurrent", "scale_hint", "tried_note", "verified"]

#: a loss this large at the first step means the targets (or inputs) were never scaled
LARGE_FIRST_LOSS = 1e6


def verified(case: Case) -> Trial | None:
    """The first fix tried on the failing step that trained (``None``: none did, or none was
    tried)."""
    return next((t for t in case.ctx.trials if t.verified), None)


def _lr_tried(case: Case) -> list[float]:
    return [t.lr for t in case.ctx.trials if t.lr is not None and t.fix.lr_factor is not None]


def tried_note(case: Case, lr_only: bool = False) -> str:
    """What the trials on the failing step said, for the comment of the line they decided:
    ``"verified on the failing step: loss 4.1 → 2.3"`` or ``"untried: lr=0.001, 0.0001 did not
    train on the failing step"`` (empty without trials). ``lr_only``: for a learning-rate line —
    a clip or a weight decay that trained verified no learning rate."""
    good = verified(case)
    if good is not None and (not lr_only or good.fix.lr_factor is not None):
        return "verified on the failing step: loss " + " → ".join(f"{v:.3g}" for v in (good.losses[0], good.losses[-1]))
    lrs = _lr_tried(case)
    if not lrs:
        return ""
    if all(t.fails_at_start for t in case.ctx.trials):
        return (f"untried: the step failed at the weights of step {case.ctx.trials[0].from_step} "
                "whatever the learning rate")
    return f"untried: lr={', '.join(f'{x:.2g}' for x in lrs)} did not train on the failing step"


def lower_lr(case: Case) -> float | None:
    """The learning rate to suggest: one that trained when tried on the failing step; else the
    one that ran, times the factor that brings the measured update/weight ratio to about 1e-2
    (the top of the healthy range) — ÷4 when the updates were of a healthy size or were not
    measured (a learning rate 10⁵× too high is not cut by 4) — and below every one tried."""
    good = verified(case)
    if good is not None and good.lr is not None and good.fix.lr_factor is not None:
        return good.lr
    tried = _lr_tried(case)
    if tried:
        return min(tried) / 10
    lr = case.ctx.lr
    if not lr:
        return None
    ratio = case.trend.median_update_ratio
    factor = 0.25
    if ratio is not None and math.isfinite(ratio) and ratio > 0.02:
        factor = min(0.25, TARGET_RATIO / ratio)
    return lr * factor


def _lr_text(case: Case, low: float | None) -> str:
    """The learning rate as the suggested line writes it: the one a trial verified, as it ran;
    else a round number a person would type (never above ``low``)."""
    good = verified(case)
    if good is not None and good.lr is not None and good.fix.lr_factor is not None:
        return f"{good.lr:.2g}"
    return nice_lr(low) if low else "1e-3"


def _no_repeat(case: Case, fixes: list[str]) -> list[str]:
    """Drop the clipping fix when the script already clips at least as tightly."""
    own, clip = case.ctx.clip_norm, case.trend.clip_threshold
    if own is None or own > clip * 1.0001:
        return fixes
    return [f for f in fixes if "clip" not in f.lower() or "lr=" in f or "learning_rate=" in f]


def lr_fixes(case: Case) -> list[str]:
    """A lower learning rate (or a lower peak of the schedule that sets it), and clipping."""
    ctx, say, trend = case.ctx, case.say, case.trend
    lr = ctx.lr
    low = lower_lr(case)
    top = max([*trend.lrs, lr or 0.0])
    user = ctx.user_lr
    kw = {
        **case.names,
        "opt": case.opt,
        "lr": _lr_text(case, low),
        "kept": case.kept(),
        "was": _was(user, tried_note(case, lr_only=True)),
        "clip": f"{trend.clip_threshold:g}",
        "sched": ctx.scheduler or "",
        "peak": nice_lr(top / 4),
        "top": num(top),
    }
    book = say.lr.lr_fixes
    if ctx.scheduler in ("OneCycleLR", "CyclicLR") and say.lr.lr_fixes_cyclic is not None:
        book = say.lr.lr_fixes_cyclic
    elif ctx.scheduler is not None and say.lr.lr_fixes_scheduled is not None:
        book = say.lr.lr_fixes_scheduled
    elif ctx.scheduler is None and trend.schedule_varied and say.lr.lr_fixes_varying is not None:
        # the learning rate changed from step to step: a schedule (perhaps written by hand,
        # assigning param_group["lr"]) would overwrite a new optimizer's lr — cap its peak
        book = say.lr.lr_fixes_varying
    fixes = [t.format(**kw) for t in book]
    if ctx.optimizer is None and say.lr.hand_update_fix is not None:
        # no optimizer: the script updates its weights itself — its own learning rate is the knob
        fixes[0] = say.lr.hand_update_fix.format(**_hand_factor(case))
        fixes = [f.replace("before optimizer.step()", "before your update") for f in fixes
                 if "lr_scheduler" not in f]  # no optimizer for a scheduler to drive
    flag = lr_flag(user, ctx.argv, _schedule_top(case))
    if flag is not None:
        # the script's own knob: the optimizer line it would replace (or the schedule that
        # overwrites it at every step) is fed by the flag
        fixes[0] = _flag_fix(case, flag, kw["lr"], low)
    return _tried_first(case, _no_repeat(case, fixes))


def _schedule_top(case: Case) -> float | None:
    """The peak learning rate of a schedule that rewrites the optimizer's (a scheduler, or the
    script's own ``param_group["lr"] = ...``): what a learning-rate flag scales; ``None``
    without one."""
    trend = case.trend
    if not (trend.schedule_varied or case.ctx.scheduler):
        return None
    return max([*trend.lrs, case.ctx.lr or 0.0])


def _flag_fix(case: Case, flag: Flag, lr_text: str, low: float | None) -> str:
    """The learning-rate flag, as the user typed it, with the value to use: the suggested
    learning rate — or, when a schedule scales the flag's value (it is not the learning rate
    that ran), that value times the factor the suggestion applies."""
    user, note = case.ctx.user_lr, tried_note(case, lr_only=True)
    good = verified(case)
    how = ""
    new = lr_text
    if user is None or not math.isclose(flag.value, user, rel_tol=1e-6):
        factor = (good.fix.lr_factor if good is not None and good.fix.lr_factor is not None
                  else (low / user if low and user else 0.25))
        new = f"{flag.value * factor:.2g}"
        how = " (your schedule scales it: the learning rate was " + num(user or 0.0) + " at this step)"
    text = case.say.lr.lr_flag_fix.format(new=flag.typed(new), old=flag.typed(), how=how)
    return text + (f" ({note})" if note else "")


def _hand_factor(case: Case) -> dict[str, str]:
    """The factor for a hand-written update's learning rate: the one that brings the measured
    update/weight ratio to about 1e-2, else ÷4."""
    ratio, bound = case.trend.median_update_ratio, case.trend.norm_change_ratio
    if ratio is None and bound is not None and math.isfinite(bound) and bound > 0.02:
        f = min(0.25, TARGET_RATIO / bound)
        return {"factor": f"{f:.2g}", "why": f"untried: sized from the weight norm's change, "
                f"{num(bound)} of the weights a step at least (healthy: ≈ 1e-3)"}
    if ratio is not None and math.isfinite(ratio) and ratio > 0.02:
        f = min(0.25, TARGET_RATIO / ratio)
        return {"factor": f"{f:.2g}", "why": f"sized from the update/weight ratio {num(ratio)} (healthy: ≈ 1e-3)"}
    return {"factor": "0.25", "why": "untried: no optimizer to try it with"}


def _was(user: float | None, note: str) -> str:
    parts = [p for p in (f"was {num(user)}" if user else "", note) if p]
    return f"  # {'; '.join(parts)}" if parts else ""


def _tried_first(case: Case, fixes: list[str]) -> list[str]:
    """A clipping threshold that trained on the failing step (where no learning rate was
    tried, or none trained) goes first, said so."""
    good = verified(case)
    if good is None or good.fix.lr_factor is not None or good.fix.clip_norm is None:
        return fixes
    clip = [i for i, f in enumerate(fixes) if "clip" in f.lower() and "lr=" not in f and "learning_rate=" not in f]
    if not clip:
        return fixes
    first = fixes[clip[0]] + f"  # {tried_note(case)}"
    return [first, *(f for i, f in enumerate(fixes) if i != clip[0])]


def explode_fixes(case: Case) -> list[str]:
    """Clipping at a threshold from the calm part of the history, and a lower learning rate."""
    low = lower_lr(case)
    kw = {
        **case.names,
        "opt": case.opt,
        "clip": f"{case.trend.clip_threshold:g}",
        "lr": _lr_text(case, low),
        "kept": case.kept(),
    }
    fixes = _tried_first(case, _no_repeat(case, [t.format(**kw) for t in case.say.lr.explode_fixes]))
    good = verified(case)
    at = next((i for i, f in enumerate(fixes) if "lr=" in f or "learning_rate=" in f), None)
    if good is not None and good.fix.lr_factor is not None:
        # a learning rate trained on the failing step: it goes first, said so
        if at is not None:
            fixes.insert(0, fixes.pop(at) + f"  # {tried_note(case)}")
    elif at is not None and at > 0 and case.ctx.optimizer in ADAPTIVE_OPTIMIZERS and case.trend.big_updates:
        # Adam's step is about lr per weight whatever the gradient: a clip stops the overflow,
        # not the steps that swamp the weights — the learning rate goes first
        ratio = case.trend.median_update_ratio
        fixes.insert(0, fixes.pop(at) + f"  # {case.ctx.optimizer}'s steps were {num(ratio or 0.0)} of the "
                     "weights (healthy ≈ 1e-3): clipping the gradients does not shrink them")
    if at is not None:
        # a learning rate from the command line is changed there (a schedule that rewrites
        # param_group["lr"] every step would overwrite a new optimizer line)
        flag = lr_flag(case.ctx.user_lr, case.ctx.argv, _schedule_top(case))
        i = next((i for i, f in enumerate(fixes) if "lr=" in f or "learning_rate=" in f), None)
        if flag is not None and i is not None:
            fixes[i] = _flag_fix(case, flag, kw["lr"], low)
    if case.say.lr.recurrent_fix is not None and recurrent(case):
        fixes.append(case.say.lr.recurrent_fix)
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
        case.say.lr.scale_targets,
    )
