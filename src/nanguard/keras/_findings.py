"""How the Keras guard turns a failed check into a :class:`~nanguard.core.finding.Finding`.

Runs after a step whose traced check failed: the step's Python function is replayed eagerly
under the locator (:func:`locate_step`); where it cannot be, the check's own numbers make the
finding (:func:`watch_finding`); an update that made the weights (or slots) non-finite is the
optimizer's (:func:`optimizer_finding`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.finding import Finding
from ..core.source import user_frame
from ._compat import var_path
from ._stats import finding_for
from .replay import replay
from .watch import GuardState, StepStats

if TYPE_CHECKING:
    from .guard import KerasGuard

__all__ = ["finite", "locate_step", "optimizer_finding", "watch_finding"]

#: called only when a replay is needed: (the step function to run again, its named batch tensors)
Prepare = Callable[[], tuple[Callable[[], Any], Sequence[tuple[str, Any]]]]


def finite(v: Any) -> bool:
    """Is every value of the Keras variable ``v`` finite?"""
    return bool(np.isfinite(np.asarray(v.numpy(), dtype=np.float64)).all())


def locate_step(
    guard: KerasGuard,
    state: GuardState,
    s: StepStats,
    prepare: Prepare | None,
) -> Finding:
    """Replay the step under the locator; the watch's finding (with a note) if it cannot."""
    finding: Finding | None = None
    extra: dict[str, Any] = {}
    if guard.replay_enabled and prepare is not None:
        replay_fn, batch = prepare()
        finding, extra = replay(
            replay_fn, model=guard.model, optimizers=guard.optimizers, batch=batch, step=guard.step
        )
    if finding is None:
        finding = watch_finding(guard, state, s)
        if not guard.replay_enabled:
            pass
        elif prepare is None:
            finding.details.setdefault(
                "note",
                "this update ran outside a step nanguard can replay: decorate the step "
                "function with guard.wrap, or use nanguard.keras.locate() / --trace, for the "
                "exact op",
            )
        else:
            errs = "; ".join(extra.get("errors") or [])
            finding.details.setdefault(
                "note",
                "the replay of this step did not reproduce the non-finite value"
                + (f" ({errs})" if errs else "")
                + "; nanguard.keras.locate() / --trace names the exact op",
            )
    scale = extra.get("activation_scale") or []
    if scale:
        finding.details.setdefault("activation_scale", [list(x) for x in scale[:32]])
    if finding.step is None:
        finding.step = guard.step
    return finding


def watch_finding(guard: KerasGuard, state: GuardState, s: StepStats) -> Finding:
    """What the traced check itself saw: the first non-finite gradient, or the loss."""
    names = state.var_names
    bad = [i for i, v in enumerate(s.grad_norms) if not math.isfinite(v)]
    if s.loss_finite and bad:
        pnames = [names[i] for i in bad if i < len(names)]
        first = pnames[0] if pnames else ""
        return finding_for(
            None, "backward", None, module=first.rsplit("/", 1)[0] if "/" in first else None,
            step=guard.step, reached="gradients", detected_by="watch", details={"gradients": pnames},
        )
    return finding_for(
        None, "forward", None, step=guard.step, reached="loss", detected_by="watch",
        details={"losses": [s.loss if s.loss is not None and math.isfinite(s.loss) else str(s.loss)]},
    )


def optimizer_finding(guard: KerasGuard, state: GuardState, s: StepStats) -> Finding:
    """The update made the weights (or the optimizer's slots) non-finite."""
    opt = state.optimizer
    bad = [v for v in state.var_refs if not finite(v)]
    bad_slots = [v for v in state.slot_refs if not finite(v)]
    reached = "parameters"
    owner_of_slot: Any = None
    if not bad and bad_slots:
        bad, reached = bad_slots, "optimizer state"
        key = var_path(bad[0]).replace("/", "_")
        owner_of_slot = next(
            (v for v in state.var_refs if var_path(v).replace("/", "_") in key), None
        )
    pnames = [var_path(v) for v in bad]
    layer_of = var_path(owner_of_slot) if owner_of_slot is not None else (pnames[0] if pnames else "")
    first = bad[0] if bad else (state.var_refs[0] if state.var_refs else None)
    loc = user_frame(2)
    return finding_for(
        first,
        "optimizer",
        f"{type(opt).__name__}.apply",
        module=layer_of.rsplit("/", 1)[0] if "/" in layer_of else None,
        source=loc.short if loc else None,
        source_code=loc.code if loc else None,
        step=guard.step,
        reached=reached,
        detected_by="watch",
        details={
            "parameters": pnames,
            "grads_finite": True,
            "grad_norm": s.grad_norm if math.isfinite(s.grad_norm) else None,
            "state": _slot_summary(opt, bad[:1]),
            "note": "the ops inside the optimizer's update are not replayed; "
            "nanguard.keras.locate() / nanguard run --trace names them",
        },
    )

def _slot_summary(opt: Any, variables: Sequence[Any]) -> dict[str, Any]:
    """The optimizer's slots (momentum, velocity, ...) of the first bad variable."""
    out: dict[str, Any] = {}
    for v in variables:
        key = var_path(v).replace("/", "_")
        for sv in getattr(opt, "variables", []):
            name = var_path(sv)
            if key and key in name.replace("/", "_") and sv is not v:
                a = np.asarray(sv.numpy(), dtype=np.float64)
                out[name] = {
                    "nonfinite": int((~np.isfinite(a)).sum()),
                    "zeros": int((a == 0).sum()),
                    "min": float(np.nan_to_num(a).min()) if a.size else None,
                }
    return out
