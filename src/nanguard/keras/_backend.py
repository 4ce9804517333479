"""What the Keras guard does to the run: the :class:`~nanguard.core.controller.Backend` the step
controller acts through after a non-finite step, and the snapshots a rollback restores.

The traced step has already skipped a bad update and put its non-trainable state back, so
skipping is a no-op here; a rollback restores every model and optimizer variable from the last
:class:`~nanguard.keras.snapshot.Snapshot` (taken before the first update, then every
``snapshot_every`` healthy steps); the guard variables (``lr_scale``, ``clip``, ``epsilon``)
carry the new settings into the traced step without a retrace.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.case import RunContext
from ..core.diagnosis import Diagnosis
from ..core.finding import Finding
from ..core.history import History
from ..core.snapbudget import SnapshotBudget
from ..core.trials import Fix, Trial
from ._compat import unwrap_optimizer
from ._context import eps_of, run_context
from ._findings import Prepare, locate_step
from .replay import state_variables
from .snapshot import Snapshotter
from .watch import GuardState, StepStats

if TYPE_CHECKING:
    from .guard import KerasGuard

log = logging.getLogger("nanguard")

__all__ = ["KerasBackend", "all_variables", "initial_snapshot", "maybe_snapshot",
           "snapshot_before_first_update"]


class KerasBackend:
    """The step port of the Keras step that just ran (see :class:`~nanguard.core.step.StepPort`):
    what the step driver asks of Keras, and how a decision is carried out."""

    adaptive = False  # the Keras guard clips inside the traced step: no clip is ruled out
    script_clip: float | None = None

    def __init__(self, guard: KerasGuard, state: GuardState, stats: StepStats,
                 prepare: Prepare | None = None) -> None:
        self.guard = guard
        self.state = state
        self.stats = stats
        self.prepare = prepare
        self.eps = eps_of(state)
        self.snapshot_after = False  # a snapshot is due once the step's record is in

    # --- what the driver asks ------------------------------------------------------------------
    def agree(self, ok: bool) -> tuple[bool, list[int]]:
        return ok, ([] if ok else [0])  # one process: Keras runs are not distributed here

    def locate(self) -> Finding:
        return locate_step(self.guard, self.state, self.stats, self.prepare)

    def history(self) -> History:
        return self.guard.history

    def context(self) -> RunContext:
        """At a failure: the run's context, with the scale of the failing step's batch."""
        ctx = run_context(self.guard, self.state)
        if self.prepare is None:
            return ctx
        from ._datascale import data_scale

        try:
            _fn, batch = self.prepare()
        except Exception:  # no batch to read: the context without its scale
            log.debug("nanguard: the failing batch could not be read for its scale", exc_info=True)
            return ctx
        return replace(ctx, data_scale=data_scale(batch, self.guard.model))

    def share(self, finding: Finding | None, diag: Diagnosis | None,
              bad_ranks: list[int]) -> tuple[Finding, Diagnosis]:
        assert finding is not None and diag is not None
        return finding, diag

    def snapshot(self, before_update: bool) -> None:
        if not before_update:
            self.snapshot_after = True  # taken after the record (the controller reads it)

    def apply_settings(self, lr_scale: float, clip_norm: float | None) -> None:
        return None  # the traced step reads the guard variables (lr_scale, clip) itself

    # --- the controller's Backend ---------------------------------------------------------------
    def skip_update(self) -> None:
        return None  # the traced step did not apply it

    def rollback(self, older: bool = False) -> int | None:
        snap = self.guard.snapshots.last  # Keras keeps one snapshot: ``older`` restores it too
        if snap is None:
            return None
        Snapshotter.restore(snap)
        for st in self.guard.states():
            st.refresh_backups()
        return int(snap.step)

    def trial(self, fixes: list[Fix]) -> list[Trial] | None:
        """Each fix tried from the snapshot on the failing step's batch (:mod:`._trial`);
        ``None`` when the step cannot be run again (an update outside a step driver)."""
        if self.prepare is None:
            return None
        from ._trial import run_trials

        step_fn, _batch = self.prepare()
        return run_trials(self.guard, self.state, step_fn, fixes)

    def across_ranks(self, values: tuple[float | None, ...]) -> list[tuple[float | None, ...]]:
        return [values]  # one process: Keras's distribution is not watched across workers

    def settings_changed(self) -> None:
        self.guard.settings_changed()

    def set_eps(self, eps: float) -> None:
        for st in self.guard.states():
            if st.eps is not None and float(st.eps.numpy()) < 1e-12:
                st.eps.assign(float(eps))

    def restore_state(self) -> dict[str, Any]:
        fixed = self.state.restore_metrics()
        return {"metrics_restored": fixed} if fixed else {}


def all_variables(guard: KerasGuard) -> list[Any]:
    vs = state_variables(guard.model, guard.optimizers)
    if guard.model is not None:
        metrics = {id(v) for v in getattr(guard.model, "metrics_variables", [])}
        vs = [v for v in vs if id(v) not in metrics]
    return vs


def optimizers_built(guard: KerasGuard) -> bool:
    return bool(guard.optimizers) and all(
        getattr(unwrap_optimizer(o), "built", False) for o in guard.optimizers
    )


def _first(guard: KerasGuard, variables: list[Any]) -> bool:
    """May the first snapshot (before any update) be taken? Always under skip/recover; under
    ``raise`` when the state is small enough to copy before a step time is known."""
    if guard.snapshots.last is not None:
        return False
    return guard.policy != "raise" or _nbytes(variables) <= SnapshotBudget.FIRST_BYTES


def initial_snapshot(guard: KerasGuard) -> None:
    if guard.snapshots.last is not None:
        return
    if guard.model is not None and optimizers_built(guard) and guard.model.built:
        vs = all_variables(guard)
        if _first(guard, vs):
            guard.snapshots.take(guard.step, vs)


def snapshot_before_first_update(guard: KerasGuard, optimizer: Any, variables: list[Any]) -> None:
    """Before the first update of a run whose optimizer was built only now (a custom loop,
    ``nanguard run``): the first snapshot, so a rollback is possible from the start."""
    if guard.snapshots.last is not None:
        return
    vs = all_variables(guard) if guard.model is not None else []
    seen = {id(v) for v in vs}
    for v in [*variables, *getattr(optimizer, "variables", [])]:
        if id(v) not in seen:
            seen.add(id(v))
            vs.append(v)
    if _first(guard, vs):
        guard.snapshots.take(guard.step, vs)


def _nbytes(variables: list[Any]) -> int:
    return sum(int(np.prod(v.shape)) * np.dtype(getattr(v, "dtype", "float32")).itemsize for v in variables)


def maybe_snapshot(guard: KerasGuard) -> None:
    """After a healthy step: a snapshot every ``snapshot_every`` steps (skip/recover) — under
    ``raise`` only while it is cheap and small (:class:`~nanguard.core.snapbudget.SnapshotBudget`),
    to try the advice from."""
    if guard.policy == "raise":
        guard.budget.tick(time.perf_counter())
        last = guard.snapshots.last
        if not optimizers_built(guard) or not guard.budget.due(
                guard.step, None if last is None else last.step, guard.snapshots.every,
                lambda: _nbytes(all_variables(guard))):
            return
        if guard.controller.snapshot_ok():
            t0 = time.perf_counter()
            guard.snapshots.take(guard.step, all_variables(guard))
            guard.budget.cost = time.perf_counter() - t0
        return
    wanted = guard.controller.snapshot_wanted()  # a raised learning rate is tried from here
    if not wanted and not guard.snapshots.due(guard.step):
        return
    if not wanted and not guard.controller.snapshot_ok():
        return  # finite, but not healthy by the controller's signals: not "last known good"
    if not optimizers_built(guard):
        return
    guard.snapshots.take(guard.step, all_variables(guard))


def build_optimizers(guard: KerasGuard) -> None:
    """Build unbuilt optimizers on the model's trainable variables, as their first ``apply``
    would: the first snapshot (before any update) then holds their state too."""
    if guard.model is None or not getattr(guard.model, "built", False):
        return
    from keras.src import backend as kbackend

    for opt in guard.optimizers:
        if not getattr(opt, "built", False):
            with kbackend.name_scope(opt.name, caller=opt):
                opt.build(guard.model.trainable_variables)
            opt.built = True
