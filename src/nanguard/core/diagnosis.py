"""Diagnosis: choose one cause from the taxonomy, with evidence and fixes written as code.

Runs once, after a finding: it reads the finding's typed evidence (what op made the value, from
what inputs), the trends of the run's history (loss, gradient norm, weight norm and learning
rate of the healthy steps) and the adapter's :class:`RunContext`, and asks the rules of
:data:`RULES` in order — from the most specific evidence (the batch itself was bad) to the most
circumstantial (a trend in the history). The first rule that returns a diagnosis wins.

:data:`RULES` is the one place where the order of the rules lives. A rule is a function
``Case -> Diagnosis | None`` in :mod:`nanguard.core.rules`; to add one, write it there (reading
only ``case.ev``, ``case.trend``, ``case.ctx`` and spelling fixes with ``case.say``), test it with
a hand-written :class:`~nanguard.core.case.Case`, and insert it into the table.
"""

from __future__ import annotations

from dataclasses import replace

from .case import Case, Diagnosis, Rule, RunContext
from .finding import Finding
from .history import History
from .rules import inputs, optimizer, overflow, precision, roots, scale, singular
from .trends import clip_threshold

__all__ = ["RULES", "Diagnosis", "RunContext", "diagnose"]

#: The rules, most specific first; the first that matches decides. The last one always matches.
RULES: tuple[Rule, ...] = (
    # the value was non-finite before any op made it
    inputs.batch_holds_nonfinite,
    # a symptom (an exp overflow, non-finite running statistics) of the far too large update before it
    roots.update_made_the_symptom,
    inputs.weights_already_nonfinite,
    inputs.mask_row_became_nan,
    inputs.explicit_nonfinite_constant,
    # the update
    optimizer.decay_too_strong,
    optimizer.clip_norm_overflowed,
    optimizer.optimizer_squares_overflowed,
    optimizer.optimizer_made_nonfinite,
    # the data's scale, behind updates too large for the weights
    scale.unscaled_data,
    optimizer.optimizer_step_too_large,
    # an op: its dtype, then its singular points
    precision.low_precision_overflow,
    singular.op_at_singularity,
    singular.nonfinite_from_small_inputs,
    # ordinary arithmetic overflowed: the history decides
    overflow.first_backward_overflow,
    overflow.first_step_overflow_small_activations,
    overflow.initial_weights_overflow,
    overflow.backward_overflow,
    overflow.updates_too_large,
    overflow.grad_norm_grew,
    overflow.expansive_recurrence,
    overflow.sudden_overflow,
)


def diagnose(
    finding: Finding, history: History | None = None, context: RunContext | None = None
) -> Diagnosis:
    """Choose the cause of ``finding`` and explain it.

    Called once, after the locator or the replay produced the finding (so at the failing step,
    before anything is skipped or rolled back).
    """
    return diagnose_case(Case.of(finding, history, context))


def diagnose_case(case: Case) -> Diagnosis:
    """The diagnosis of a :class:`~nanguard.core.case.Case`: the first rule of :data:`RULES`
    that matches, named in :attr:`Diagnosis.rule`."""
    for rule in RULES:
        d = rule(case)
        if d is not None:
            return replace(d, rule=rule.__name__)
    raise AssertionError("the last rule of RULES always matches")  # pragma: no cover


def _clip_threshold(h: History) -> float:
    """A clipping threshold from the healthy history (kept for the adapters that import it)."""
    return clip_threshold(h.series("grad_norm", 200))
