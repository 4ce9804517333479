"""Rules for an overflow of ordinary arithmetic (no singularity): the history tells bad
initialization (the first step), exploding gradients (a backward overflow, a growing gradient
norm) and a learning rate too high (growing weights, large updates) apart."""

from __future__ import annotations

import math

from ..case import Case, Diagnosis
from ..taxonomy import Cause
from ._fmt import num
from .fixes import explode_fixes, lr_fixes, scale_hint

__all__ = [
    "backward_overflow",
    "expansive_recurrence",
    "first_backward_overflow",
    "first_step_overflow_small_activations",
    "grad_norm_grew",
    "initial_weights_overflow",
    "sudden_overflow",
    "updates_too_large",
]

#: module outputs below this are "small": the initial weights did not blow them up
CALM_ACTIVATION = 1e3
_TRACE_FIX = "nanguard run --trace script.py  # names the op that made it"


def _made(case: Case) -> list[str]:
    """What every overflow diagnosis says first: which op made what, from inputs how large."""
    ev = case.ev
    if ev.op is None:
        lines = [f"{ev.what} appeared {ev.where}; the op that made it was not found "
                 f"(`nanguard run --trace` names it)"]
    else:
        lines = [f"`{case.shown}` {ev.where} produced {ev.what} from finite inputs"]
    x = max(ev.inputs, key=lambda s: s.absmax or 0.0, default=None)
    if x is not None and x.absmax is not None:
        lines.append(f"its largest input magnitude was {num(x.absmax)} ({x.name})")
    return lines


def _first_step_lines(case: Case) -> list[str]:
    lines = _made(case)
    scale = case.ev.headroom.activation_scale
    if scale:
        s = " → ".join(f"{num(v)}" for _, v in scale[:6])
        lines.append(f"activation scale (max |x|) layer by layer at the first step: {s}")
    return lines


def _calm_peak(case: Case) -> float | None:
    """The largest module output at the first step when it stayed small, else ``None``."""
    top = case.ev.activation_peak
    return top if top is not None and math.isfinite(top) and top < CALM_ACTIVATION else None


def first_backward_overflow(case: Case) -> Diagnosis | None:
    """The forward pass of the first step was finite, the gradients overflowed in its backward:
    the initial weights' gain, compounded by depth or time steps."""
    ev, say = case.ev, case.say
    if not case.first_step or ev.phase != "backward":
        return None
    lines = _first_step_lines(case)
    calm = _calm_peak(case)
    if calm is not None:
        lines.append(f"the activations stayed small (at most {num(calm)})")
    lines.append("the forward pass was finite: the gradients overflowed in the first backward pass, "
                 "before any update")
    fixes = explode_fixes(case)
    if say.init.smaller_gain is not None:
        fixes.append(say.init.smaller_gain)
    if ev.op is None:
        fixes.append(_TRACE_FIX)
    return Diagnosis(
        Cause.EXPLODING_GRADIENTS, 0.7 if ev.op is not None else 0.4,
        "the gradients overflowed in the first backward pass", lines, fixes,
    )


def first_step_overflow_small_activations(case: Case) -> Diagnosis | None:
    """A forward overflow at the first step whose module outputs stayed small: the large values
    were made outside them, before any update (low confidence: the activations do not show the
    initial weights' scale)."""
    if not case.first_step:
        return None
    calm = _calm_peak(case)
    if calm is None:
        return None
    lines = _first_step_lines(case)
    lines.append(f"the module outputs recorded before it stayed below {CALM_ACTIVATION:g} (at most "
                 f"{num(calm)}): the values that overflowed were made outside them, before any update")
    return Diagnosis(
        Cause.BAD_INITIALIZATION, 0.4,
        "an overflow at the first step, before any update", lines, [_TRACE_FIX],
    )


def initial_weights_overflow(case: Case) -> Diagnosis | None:
    """A forward overflow at the first step, before any update: the initial weights overflow."""
    if not case.first_step:
        return None
    lines = _first_step_lines(case)
    lines.append("no update had been applied yet: the initial weights alone overflow")
    return Diagnosis(
        Cause.BAD_INITIALIZATION, 0.85, "the initial weights make activations overflow", lines,
        [case.say.init.init_fix, case.say.init.add_normalization],
    )


def backward_overflow(case: Case) -> Diagnosis | None:
    """A backward op overflowed after healthy steps, with the weights steady: the gradients."""
    if case.ev.phase != "backward" or case.trend.weights_grew:
        return None
    lines = _made(case)
    g = case.trend.grads
    if g is not None:
        lines.append(f"grad norm over the last steps: {num(g.first)} → {num(g.last)} ({num(g.factor)}x)")
    lines.append("the forward pass was finite: the gradients overflowed in the backward pass")
    return Diagnosis(
        Cause.EXPLODING_GRADIENTS, 0.8, "the gradients overflowed in the backward pass", lines,
        explode_fixes(case),
    )


def updates_too_large(case: Case) -> Diagnosis | None:
    """The weight norm grew (≥ 4× over 8 steps or ≥ 1.5× per step) or the updates were large
    (update/weight ratio ≥ 0.05): the learning rate is too high."""
    trend, ctx = case.trend, case.ctx
    if not (trend.weights_grew or trend.big_updates):
        return None
    lines = _made(case)
    w, loss = trend.weights, trend.loss
    if w is not None and w.factor >= 1:
        per = f", ×{num(trend.weights_per_step)} per step" if trend.weights_per_step else ""
        lines.append(f"the weight norm grew {num(w.factor)}x over the last {trend.window} steps: "
                     f"{num(w.first)} → {num(w.last)}{per}")
    elif w is not None:
        lines.append(f"the weight norm over the last {trend.window} steps: {num(w.first)} → {num(w.last)}")
    if trend.median_update_ratio is not None:
        lines.append(f"update/weight ratio ≈ {num(trend.median_update_ratio)} per step "
                     "(healthy training: ≈ 1e-3)")
    loss_rose = loss is not None and loss.factor > 2
    if loss is not None and loss_rose:
        lines.append(f"the loss rose {num(loss.factor)}x: {num(loss.first)} → {num(loss.last)}")
    if ctx.lr is not None:
        lines.append(f"learning rate {num(ctx.lr)}" + (f" ({ctx.optimizer})" if ctx.optimizer else ""))
    if ctx.clip_norm is not None and trend.weights_grew:
        lines.append(f"gradients were clipped at {num(ctx.clip_norm)}, so the growth is in the weights, "
                     "not the gradient norm")
    conf = 0.85 if (trend.weights_grew and (trend.big_updates or loss_rose)) else 0.7
    fixes = lr_fixes(case)
    hint = scale_hint(case)
    if hint is not None:
        lines.append(hint[0])
        fixes.insert(0, hint[1])
    return Diagnosis(
        Cause.LEARNING_RATE_TOO_HIGH, conf, "updates too large for the weights: they blew up", lines, fixes,
    )


def grad_norm_grew(case: Case) -> Diagnosis | None:
    """The gradient norm grew ≥ 10× over the last steps until a value overflowed."""
    g = case.trend.grads
    if g is None or not case.trend.grads_grew:
        return None
    lines = _made(case)
    lines.append(f"grad norm grew {num(g.factor)}x over the last steps: {num(g.first)} → {num(g.last)}")
    return Diagnosis(
        Cause.EXPLODING_GRADIENTS, 0.75, "the gradient norm grew until the values overflowed", lines,
        explode_fixes(case),
    )


def _recurrence_of(case: Case) -> tuple[str, float, float] | None:
    """The measured recurrence the failing op ran in (the module itself or one inside it)."""
    mod = case.ev.module
    if mod is None:
        return None
    for path, (rate, at) in case.ctx.recurrences.items():
        if path == "" or mod == path or mod.startswith(path + "."):
            return path, rate, at
    return None


def expansive_recurrence(case: Case) -> Diagnosis | None:
    """A forward overflow inside a recurrence that the hazard look measured growing on its first
    sampled steps, with the weights steady since: the recurrence was expansive from the initial
    weights, and a long enough sequence overflowed it."""
    got = _recurrence_of(case)
    if got is None or case.ev.phase != "forward" or case.trend.weights_grew or case.trend.big_updates:
        return None
    path, rate, at = got
    name = f"`{path}`" if path else "the model"
    lines = _made(case)
    lines.append(f"{name} is a recurrence (fed its own output) that was measured expansive on the early steps: "
                 f"its gradient grew ×{num(rate)} per call going back; ~{at:.0f} calls overflow at that rate")
    lines.append("the weights did not grow since: the gain came with the initial weights, and a sequence long "
                 "enough overflowed")
    say = case.say
    fixes = [f for f in (say.init.smaller_gain, say.lr.recurrent_fix, say.init.init_fix) if f is not None][:2]
    return Diagnosis(
        Cause.BAD_INITIALIZATION, 0.7, "an expansive recurrence from the initial weights overflowed on a long "
        "sequence", lines, fixes,
    )


def sudden_overflow(case: Case) -> Diagnosis:
    """The last rule: an overflow with no trend in the history (always matches)."""
    lines = _made(case)
    lines.append("no clear trend in the history: the overflow came suddenly")
    return Diagnosis(
        Cause.LEARNING_RATE_TOO_HIGH if case.ev.phase != "backward" else Cause.EXPLODING_GRADIENTS,
        0.4, "an ordinary operation overflowed", lines, lr_fixes(case),
    )
