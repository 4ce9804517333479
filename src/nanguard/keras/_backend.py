"""What the Keras guard does to the run: the :class:`~nanguard.core.controller.Backend` the step
controller acts through after a non-finite step, and the snapshots a rollback restores.

The traced step has already skipped a bad update and put its non-trainable state back, so
skipping is a no-op here; a rollback restores every model and optimizer variable from the last
:class:`~nanguard.keras.snapshot.Snapshot` (taken before the first update, then every
``snapshot_every`` healthy steps); the guard variables (``lr_scale``, ``clip``, ``epsilon``)
carry the new settings into the traced step without a retrace.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._compat import unwrap_optimizer
from .replay import state_variables
from .snapshot import Snapshotter
from .watch import GuardState

if TYPE_CHECKING:
    from .guard import KerasGuard

__all__ = ["KerasBackend", "all_variables", "initial_snapshot", "maybe_snapshot",
           "snapshot_before_first_update"]


class KerasBackend:
    """Carries out one decision about the step that just ran."""

    def __init__(self, guard: KerasGuard, state: GuardState) -> None:
        self.guard = guard
        self.state = state

    def skip_update(self) -> None:
        self.guard.step_was_skipped = True  # the traced step did not apply it

    def rollback(self, older: bool = False) -> int | None:
        snap = self.guard.snapshots.last  # Keras keeps one snapshot: ``older`` restores it too
        if snap is None:
            return None
        Snapshotter.restore(snap)
        for st in self.guard._states.values():
            st.refresh_backups()
        self.guard.step_was_skipped = True
        return int(snap.step)

    def trial(self, fixes: list[Any]) -> None:
        return None  # the step is a traced function: a fix is judged by the outcome

    def settings_changed(self) -> None:
        self.guard._apply_recovery_settings()

    def set_eps(self, eps: float) -> None:
        for st in self.guard._states.values():
            if st.eps is not None and float(st.eps.numpy()) < 1e-12:
                st.eps.assign(float(eps))

    def restore_state(self) -> dict[str, Any]:
        fixed = self.state.restore_metrics()
        return {"metrics_restored": fixed} if fixed else {}


def all_variables(guard: KerasGuard) -> list[Any]:
    vs = state_variables(guard.model, guard._optimizers)
    if guard.model is not None:
        metrics = {id(v) for v in getattr(guard.model, "metrics_variables", [])}
        vs = [v for v in vs if id(v) not in metrics]
    return vs


def optimizers_built(guard: KerasGuard) -> bool:
    return bool(guard._optimizers) and all(
        getattr(unwrap_optimizer(o), "built", False) for o in guard._optimizers
    )


def initial_snapshot(guard: KerasGuard) -> None:
    if guard.policy == "raise" or guard.snapshots.last is not None:
        return
    if guard.model is not None and optimizers_built(guard) and guard.model.built:
        guard.snapshots.take(guard.step, all_variables(guard))


def snapshot_before_first_update(guard: KerasGuard, optimizer: Any, variables: list[Any]) -> None:
    """Before the first update of a run whose optimizer was built only now (a custom loop,
    ``nanguard run``): the first snapshot, so a rollback is possible from the start."""
    if guard.policy == "raise" or guard.snapshots.last is not None:
        return
    vs = all_variables(guard) if guard.model is not None else []
    seen = {id(v) for v in vs}
    for v in [*variables, *getattr(optimizer, "variables", [])]:
        if id(v) not in seen:
            seen.add(id(v))
            vs.append(v)
    guard.snapshots.take(guard.step, vs)


def maybe_snapshot(guard: KerasGuard) -> None:
    if guard.policy == "raise" or not guard.snapshots.due(guard.step):
        return
    if not guard.controller.snapshot_ok():
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

    for opt in guard._optimizers:
        if not getattr(opt, "built", False):
            with kbackend.name_scope(opt.name, caller=opt):
                opt.build(guard.model.trainable_variables)
            opt.built = True
