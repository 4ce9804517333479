"""Rules for the update: a gradient norm that overflowed inside clipping, an optimizer step
that turned finite gradients into non-finite weights, a weight decay that rescales the weights
by ``1 − lr·weight_decay`` ≤ 0 at every step."""

from __future__ import annotations

import math

from ..case import Case, Diagnosis
from ..flags import wd_flag
from ..ops import DTYPE_MAX, op_traits
from ..taxonomy import Cause
from ._fmt import nice_lr, num
from .fixes import explode_fixes, lr_fixes, tried_note, verified
from .singular import find_singularity

__all__ = [
    "clip_norm_overflowed",
    "decay_too_strong",
    "optimizer_made_nonfinite",
    "optimizer_squares_overflowed",
    "optimizer_step_too_large",
]


def clip_norm_overflowed(case: Case) -> Diagnosis | None:
    """``clip_grad_norm_`` swallowed an overflow: the gradients' total norm itself overflowed, so
    every gradient was scaled by 0."""
    ev, say, trend = case.ev, case.say, case.trend
    if not ev.clip_overflow:
        return None
    lines = [
        f"`{case.shown}` {ev.where} overflowed: the total gradient norm is {ev.what}",
        f"{say.clip_norm_fn} then scaled every gradient by 0: the update was silently zero "
        "and its returned norm was the only trace",
    ]
    g = trend.grads
    if g is not None and g.factor >= 2:
        lines.append(f"grad norm over the last steps: {num(g.first)} → {num(g.last)} ({num(g.factor)}x)")
    if ev.largest_input:
        lines.append(f"single gradient entries reached {num(ev.largest_input)}")
    fixes = [
        say.lr.clip_by_value.format(opt=case.opt, **case.names),
        "check what scales the loss this much (a loss summed instead of averaged, a loss scale, "
        "an unnormalised target)",
    ]
    lr = case.ctx.lr
    if lr:
        fixes.append(say.lr.new_lr.format(opt=case.opt, lr=nice_lr(lr / 4), kept=case.kept(), **case.names))
    return Diagnosis(
        Cause.EXPLODING_GRADIENTS, 0.85, f"the gradient norm overflowed inside {say.clip_norm_fn}",
        lines, fixes,
    )


def optimizer_squares_overflowed(case: Case) -> Diagnosis | None:
    """Finite gradients so large that the optimizer's squares (Adam's ``exp_avg_sq``) overflow."""
    ev, say = case.ev, case.say
    if ev.phase != "optimizer" or ev.update.grads_finite is False:
        return None
    big = ev.largest_input
    gnorm = ev.update.grad_norm
    limit = math.sqrt(ev.dtype_max or DTYPE_MAX["float32"])  # above it, a square overflows
    squares = op_traits(ev.op_name).squares and big > limit
    if not (squares or (gnorm is not None and gnorm > limit)):
        return None
    lines = [
        f"the gradients were finite but reached {num(big or gnorm)}: their squares overflow "
        f"{ev.dtype or 'float32'} in `{say.opt_call.format(opt=case.opt)}` ({ev.what})",
    ]
    state = ev.provenance.optimizer_state
    if state:
        lines.append("non-finite optimizer state: " + ", ".join(f"`{n}`" for n in state[:3]))
    g = case.trend.grads_long
    if g is not None and g.factor > 10:
        lines.append(f"grad norm grew {num(g.factor)}x: {num(g.first)} → {num(g.last)}")
    return Diagnosis(
        Cause.EXPLODING_GRADIENTS, 0.85,
        "the gradients exploded until the optimizer's second moment overflowed",
        lines, explode_fixes(case),
    )


def _after_step(case: Case) -> list[str]:
    """What every optimizer-step diagnosis says first: the gradients, and the first bad weights."""
    ev = case.ev
    lines = []
    if ev.update.grads_finite is not False:
        gn = case.trend.last_grad_norm
        lines.append(
            "all gradients were finite" + (f" (norm {num(gn)})" if gn is not None else "")
            + f", yet `{case.say.opt_call.format(opt=case.opt)}` made {ev.what}"
        )
    params = ev.provenance.parameters
    if params:
        lines.append("first non-finite after the step: " + ", ".join(f"`{p}`" for p in params[:4]))
    return lines


def _zero_eps(case: Case) -> bool:
    eps = case.ctx.eps
    return eps is not None and eps <= 1e-30


def optimizer_made_nonfinite(case: Case) -> Diagnosis | None:
    """The optimizer's own arithmetic met a singularity: ``eps=0`` (0/0 where a second moment is
    0), or a division / square root inside the step."""
    ev, say = case.ev, case.say
    if ev.phase != "optimizer":
        return None
    zero_eps = _zero_eps(case)
    sing = None if zero_eps else find_singularity(case)
    if not zero_eps and (sing is None or ev.op_name not in ("div", "addcdiv", "sqrt", "rsqrt")):
        return None
    lines = _after_step(case)
    if zero_eps:
        lines.append(f"{case.opt} {say.eps_name}={case.ctx.hyper.get('eps', case.ctx.hyper.get('epsilon'))}: "
                     "where a gradient's second moment is 0 the update is 0/0")
    elif sing is not None:
        lines.append(sing.why)
    lr = case.ctx.lr
    return Diagnosis(
        Cause.OPTIMIZER_STATE, 0.9 if zero_eps else 0.75,
        f"`{say.opt_call.format(opt=case.opt)}` turned finite gradients into non-finite weights",
        lines, [say.lr.eps_fix.format(**case.names, opt=case.opt, lr=num(lr) if lr else "...",
                                     kept=case.kept("eps", "epsilon"))],
    )


def optimizer_step_too_large(case: Case) -> Diagnosis | None:
    """Any other optimizer step that made the weights non-finite: an update too large (±Inf), or
    the optimizer's state (NaN)."""
    ev = case.ev
    if ev.phase != "optimizer":
        return None
    lines = _after_step(case)
    lr = case.ctx.lr
    if lr is not None:
        lines.append(f"learning rate {num(lr)}")
    ratios = case.trend.recent_update_ratios
    if ratios:
        lines.append(f"update/weight ratio of the last steps: {num(max(ratios))} (healthy ≈ 1e-3)")
    return Diagnosis(
        Cause.LEARNING_RATE_TOO_HIGH if ev.infinite else Cause.OPTIMIZER_STATE,
        0.6,
        f"`{case.say.opt_call.format(opt=case.opt)}` turned finite gradients into non-finite weights",
        lines, lr_fixes(case),
    )


#: optimizers whose weight decay multiplies the weights by ``1 − lr·wd`` at each step (SGD's L2 term
#: goes into the update unnormalised; AdamW's is decoupled); Adam's L2 is normalised away. Keras
#: 3 decouples it in every optimizer.
_DECOUPLED = ("SGD", "AdamW")
#: ``lr × weight_decay`` a suggested weight decay aims for (0.1 × 5e-4 … 1e-3 × 0.1 in practice)
_WD_TARGET = 1e-4


#: weight decays up to this are the usual ones (1e-4 for SGD, 0.01-0.1 for AdamW): above it, with
#: lr × wd ≥ 1, the decay is what is off; below it, the learning rate
USUAL_WEIGHT_DECAY = 0.1


def decay_too_strong(case: Case) -> Diagnosis | None:
    """``lr × weight_decay ≥ 1``: each step multiplies the weights by ``1 − lr·wd`` ≤ 0 — they
    are zeroed, or flip sign and grow by ``|1 − lr·wd|`` a step. The learning rate alone is not
    the problem (the update/weight ratio of the gradient's part can be small): the weight decay
    is, for this learning rate — unless the decay is a usual one (≤ 0.1): then a learning rate of
    10 or more is what is far off, and the learning-rate rules say so (``AdamW(lr=30,
    weight_decay=0.1)``)."""
    ctx, say = case.ctx, case.say
    wd, lr = ctx.hyper.get("weight_decay"), ctx.lr
    if not isinstance(wd, (int, float)) or not lr or wd <= 0 or lr * wd < 1 or say.lr.weight_decay_fix is None:
        return None
    if wd <= USUAL_WEIGHT_DECAY:
        return None  # a usual weight decay: lr × wd ≥ 1 says the learning rate (≥ 10) is the one far off
    if ctx.framework == "torch" and ctx.optimizer not in _DECOUPLED:
        return None
    p = lr * wd
    lines = _made_by_update(case)
    what = (f"they flip sign and grow ×{num(abs(1 - p))} a step" if p > 2 else
            "they are zeroed or flipped every step" if p < 2 else "they flip sign every step")
    lines.append(f"weight_decay={num(wd)} with learning rate {num(lr)}: lr × weight_decay = {num(p)}, so each "
                 f"step multiplies the weights by 1 − {num(p)} = {num(1 - p)} besides the gradient's part: {what}")
    w = case.trend.weights
    if w is not None and w.factor >= 2:
        lines.append(f"the weight norm grew {num(w.factor)}x over the last {case.trend.window} steps: "
                     f"{num(w.first)} → {num(w.last)}")
    fix = say.lr.weight_decay_fix.format(**case.names, opt=case.opt, lr=num(ctx.user_lr or lr), wd=nice_lr(_WD_TARGET / lr),
                                         was=num(wd), kept=case.kept("weight_decay"))
    good = verified(case)
    note = tried_note(case) if good is not None and good.fix.weight_decay is not None else ""
    if note:
        fix += ("; " if "  # " in fix else "  # ") + note
    flag = wd_flag(wd, ctx.argv)
    if flag is not None:  # the script's own knob (``--weight-decay 1e4``)
        fix = say.lr.wd_flag_fix.format(new=flag.typed(nice_lr(_WD_TARGET / lr)), old=flag.typed())
        fix += f" ({note})" if note else ""
    return Diagnosis(
        Cause.LEARNING_RATE_TOO_HIGH, 0.85,
        f"the weight decay is too strong for the learning rate: lr × weight_decay = {num(p)}",
        lines, [fix, *lr_fixes(case)[1:2]], weight_decay=float(nice_lr(_WD_TARGET / (ctx.user_lr or lr))),
    )


def _made_by_update(case: Case) -> list[str]:
    ev = case.ev
    return [f"`{case.shown}` {ev.where} produced {ev.what}"] if ev.what else []
