"""Data far from unit scale: the root behind updates too large for the weights.

Raw features in the thousands, or regression targets in the hundreds (an MSE of 1e5 before any
update), make every gradient large: the run diverges at a learning rate that trains standardised
data, and the learning rate that keeps it finite is so small that it learns nothing. The cure is
to standardise; the learning rate is the second fix (tried on the failing step like any other).
"""

from __future__ import annotations

from ..case import Case, Diagnosis
from ..taxonomy import Cause
from ._fmt import num
from .fixes import lr_fixes
from .singular import find_singularity

__all__ = ["unscaled_data"]

#: inputs (or their per-feature scales) this far from 1 are raw, not standardised
RAW_INPUT = 1e3
#: features whose scales differ this much, the largest at least this large, were never standardised
RAW_SPREAD = 100.0
#: a regression loss this large at the first step means targets far from unit scale
RAW_FIRST_LOSS = 1e3


def _data_lines(case: Case) -> tuple[list[str], list[str]]:
    """The evidence that the inputs, and that the targets, are unscaled (empty when not)."""
    s, first = case.ctx.data_scale, case.trend.first_loss
    if s is None:
        return [], []
    inputs, targets = [], []
    if s.inputs_absmax is not None and s.inputs_absmax >= RAW_INPUT:
        inputs.append(f"the model's inputs reach {num(s.inputs_absmax)} (standardised features stay within a "
                      "few units)")
    elif s.feature_spread is not None and s.feature_spread >= RAW_SPREAD and (s.inputs_absmax or 0) >= RAW_SPREAD:
        inputs.append(f"the input features differ in scale {num(s.feature_spread)}x (largest |x| of one feature "
                      "over another's): the large ones dominate every update")
    if s.regression is not None and first is not None and first[0] <= 1 and first[1] >= RAW_FIRST_LOSS:
        y = f" (targets up to {num(s.targets_absmax)})" if s.targets_absmax else ""
        targets.append(f"the {s.regression} was already {num(first[1])} at step {first[0]}, before any update "
                       f"could blow up: the targets are far from unit scale{y}")
    return inputs, targets


def unscaled_data(case: Case) -> Diagnosis | None:
    """An overflow of ordinary arithmetic (no singular op, no low-precision dtype) in a run whose
    inputs or regression targets are far from unit scale: ``unscaled-data``, first fix
    standardise, then the learning rate."""
    ev = case.ev
    if ev.phase == "data" or ev.op in ("input", "parameter") or ev.dtype not in (None, "float32", "float64"):
        return None
    inputs, targets = _data_lines(case)
    if not (inputs or targets) or find_singularity(case) is not None:
        return None
    x = max(ev.inputs, key=lambda s: s.absmax or 0.0, default=None)
    made = f"`{case.shown}` {ev.where} produced {ev.what}" if ev.op is not None else f"{ev.what} appeared {ev.where}"
    if x is not None and x.absmax is not None:
        made += f" from inputs as large as {num(x.absmax)}"
    say = case.say.lr
    fixes = ([say.scale_inputs] if inputs else []) + ([say.scale_targets] if targets else [])
    return Diagnosis(
        Cause.UNSCALED_DATA, 0.8, "the data is far from unit scale: every update is too large",
        [made, *inputs, *targets], [*fixes, *lr_fixes(case)[:2]],
    )
