"""Trying a fix on the failing Keras step before it is applied (see :mod:`nanguard.core.trials`).

Runs only after a non-finite step whose cause has a recovery rule, under ``skip``/``recover``,
as the torch guard does: from the newest healthy snapshot, the failing step's Python function is
run again eagerly on its batch (``model.train_step(data)`` under ``fit``, the wrapped step
function of a custom loop), with the fix in the guard's variables (``lr_scale``, ``clip``,
``epsilon``: read by the traced update), :data:`~nanguard.core.trials.TRIAL_STEPS` times. The
guarded update records each run's loss, as in a real step. Every variable a step may write —
weights, optimizer state, metrics, the seed generator (the same dropout masks for every fix) —
is put back afterwards, and the guard's own step count does not move.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core.errors import internal_error
from ..core.trials import TRIAL_STEPS, Fix, Trial
from . import _patches
from ._compat import run_eagerly
from .replay import state_variables
from .snapshot import Snapshot, Snapshotter
from .watch import GuardState, clear_losses

if TYPE_CHECKING:
    from .guard import KerasGuard

__all__ = ["run_trials"]


def _settings(guard: KerasGuard, fix: Fix) -> None:
    """The guard's variables for one trial: the back-off in force × the fix's factor, its clip,
    its ``epsilon``."""
    rs = guard.recovery_state
    scale = rs.lr_scale * (fix.lr_factor if fix.lr_factor is not None else 1.0)
    clip = fix.clip_norm if fix.clip_norm is not None else rs.clip_norm
    for st in guard.states():
        st.lr_scale.assign(float(scale))
        st.clip.assign(float(clip) if clip is not None else 0.0)
        if fix.eps is not None and st.eps is not None and float(st.eps.numpy()) < fix.eps:
            st.eps.assign(float(fix.eps))


def _one(guard: KerasGuard, state: GuardState, step_fn: Callable[[], Any], fix: Fix, snap: Snapshot,
         saved: list[tuple[Any, Any]]) -> Trial:
    """One fix from the snapshot: the loss before each of the trial's updates and after the last."""
    for v, val in saved:
        v.assign(val)  # metrics, seeds: as before the trials
    Snapshotter.restore(snap)
    for st in guard.states():
        st.refresh_backups()
    _settings(guard, fix)
    losses: list[float] = []
    grads_ok = True
    lr: float | None = None
    for _ in range(TRIAL_STEPS + 1):
        clear_losses()
        with _patches.in_step(), run_eagerly():
            step_fn()
        s = state.read()
        lr = s.lr if lr is None else lr
        losses.append(s.loss if s.loss is not None and s.loss_finite else float("nan"))
        grads_ok = s.grads_finite
        if not s.finite or not s.params_finite:
            break
    return Trial(fix, tuple(losses), snap.step, lr=lr, grads_finite=grads_ok)


def run_trials(guard: KerasGuard, state: GuardState, step_fn: Callable[[], Any],
               fixes: list[Fix]) -> list[Trial] | None:
    """Try each of ``fixes`` on the failing step (see the module docstring); ``None`` when it
    cannot be (no snapshot yet, a loss-scaled optimizer, a step that raised)."""
    snap = guard.snapshots.last
    if snap is None or state.wrapper is not None:
        return None
    saved = [(v, v.numpy()) for v in state_variables(guard.model, guard.optimizers)]
    knobs = [(v, v.numpy()) for st in guard.states() for v in (st.lr_scale, st.clip, st.eps) if v is not None]
    out: list[Trial] = []
    try:
        for fix in fixes:
            out.append(_one(guard, state, step_fn, fix, snap, saved))
            if out[-1].verified or out[-1].fails_at_start:
                break  # the least drastic fix that works is the one applied
    except Exception as exc:  # the fix is then judged by the outcome
        internal_error(f"the trial of a fix on the Keras step ({type(exc).__name__})", exc)
        return None
    finally:
        for v, val in [*saved, *knobs]:
            v.assign(val)
        for st in guard.states():
            st.refresh_backups()
            st.last_count = st.read().count  # the trials' updates are no steps of the run
    return out
