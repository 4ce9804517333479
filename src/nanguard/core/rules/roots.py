"""The root behind a symptom: a value made non-finite by the update before it.

An ``exp`` overflows, or BatchNorm's running variance goes non-finite, one step after an update as
large as the weights: the op or the buffer is only where the damage first showed. Called
``unsafe-op`` or ``nonfinite-parameters`` it would send the user to clamp an ``exp`` or reload a
checkpoint, and ``recover`` would never start; the update's size is the cause, and the learning
rate the fix (tried on the failing step like any other).
"""

from __future__ import annotations

from ..case import Case, Diagnosis
from ..taxonomy import Cause
from ._fmt import num
from .fixes import lr_fixes
from .singular import find_singularity

__all__ = ["update_made_the_symptom"]

#: an update/weight ratio this large is an update about as large as the weights (healthy: about 1e-3)
HUGE_UPDATE = 0.5
#: the exp family: their overflow follows the size of their input, which an update can push
_EXP = {"exp", "exp2", "expm1", "cosh", "sinh"}


def _buffers(case: Case) -> list[str]:
    """The module buffers (running statistics) a finding names, when it names nothing else."""
    ev = case.ev
    if ev.op != "parameter" and ev.provenance.origin != "parameter":
        return []
    names = list(ev.provenance.parameters)
    if names and all("running_" in n or n.endswith("num_batches_tracked") for n in names):
        return names
    return []


def _the_update(case: Case) -> str | None:
    """The evidence that the update before the failing step was far too large, or ``None``."""
    t = case.trend
    if t.healthy_steps < 1:
        return None
    last = t.recent_update_ratios[-1] if t.recent_update_ratios else None
    if last is not None and last >= HUGE_UPDATE:
        return (f"the update just before was about as large as the weights: update/weight ratio {num(last)} "
                "(healthy training: ≈ 1e-3)")
    w = t.weights
    if w is not None and w.factor >= 10:
        return f"the weight norm grew {num(w.factor)}x over the last {t.window} steps: {num(w.first)} → {num(w.last)}"
    return None


def update_made_the_symptom(case: Case) -> Diagnosis | None:
    """An ``exp`` overflow (float32/64) or non-finite running statistics right after a far too
    large update: ``learning-rate-too-high``, with the update as evidence and the symptom beside it."""
    ev = case.ev
    update = _the_update(case)
    if update is None:
        return None
    bufs = _buffers(case)
    if bufs:
        lines = [f"`{n}` went non-finite in the last step's forward (a running statistic the model "
                 "updates itself)" for n in bufs[:3]]
        what = "running statistics"
        extra: list[str] = []
    else:
        if ev.op_name not in _EXP or ev.dtype not in (None, "float32", "float64"):
            return None
        sing = find_singularity(case)
        if sing is None:
            return None
        lines = [sing.why]
        what = f"`{ev.op_name}`'s input past its overflow"
        extra = sing.fixes[-1:]  # a guard on the op, after the learning rate
    lines.append(update)
    lines.append("the update's size is the cause: the op or the buffer is only where it first showed")
    return Diagnosis(
        Cause.LEARNING_RATE_TOO_HIGH, 0.8, f"an update too large for the weights pushed {what}"
        if not bufs else f"an update too large for the weights made the {what} non-finite",
        lines, [*lr_fixes(case), *extra],
    )
