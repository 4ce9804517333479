"""What a torch guard does to the run: the :class:`~nanguard.core.controller.Backend` the step
controller acts through after a non-finite step, and the policy's settings on healthy steps.

* after a non-finite step (:class:`TorchBackend`): hide the gradients from ``optimizer.step()``
  (they are handed back after it), roll back to the last snapshot, raise ``eps``, put back
  module buffers a bad batch poisoned;
* on every healthy step (:func:`apply_settings`, at the pre-step hook): clip at the switched-on
  threshold and multiply the learning rate by the back-off factor (taken out again after the
  step) — or, without an optimizer, scale the gradients;
* :func:`maybe_snapshot`: before the first update, then every ``snapshot_every`` steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..core.trials import Fix, Trial
from ._stats import all_finite
from .snapshot import Snapshotter, floating_buffers, module_buffers

if TYPE_CHECKING:
    from ._guard_base import GuardBase as Guard

__all__ = ["TorchBackend", "apply_settings", "maybe_snapshot"]


class TorchBackend:
    """Carries out one decision about the step in progress (made for that step only)."""

    def __init__(self, guard: Guard, params: Sequence[torch.Tensor],
                 opt: torch.optim.Optimizer | None) -> None:
        self.guard = guard
        self.params = list(params)
        self.opt = opt

    def skip_update(self) -> None:
        g = self.guard
        g.step_was_skipped = True
        if self.opt is not None:
            # never apply this update: hide the gradients from the optimizer (given back after)
            g._hidden_grads = [(p, p.grad) for p in self.params]
            for p in self.params:
                p.grad = None
        else:
            for p in self.params:  # a hand-written update follows: make it a no-op
                if p.grad is not None:
                    p.grad.zero_()

    def rollback(self, older: bool = False) -> int | None:
        g = self.guard
        snap = g.snapshots.target(older)
        if snap is None:
            return None
        self._restore_to(snap)
        g._weights_ok = True  # a snapshot only ever holds finite weights
        g.step_was_skipped = True
        return int(snap.step)

    def trial(self, fixes: list[Fix]) -> list[Trial] | None:
        from ._trial import run_trials

        return run_trials(self.guard, self.params, self.opt, fixes,
                          lambda: self._restore_to(self.guard.snapshots.last))

    def settings_changed(self) -> None:
        return None  # the pre-step hook reads the back-off and the clip at every step

    def _restore_to(self, snap: Any) -> None:
        g = self.guard
        primary = g.watch.primary
        Snapshotter.restore(snap, g.watch.params(), module_buffers(g.watch.roots()),
                            [primary] if primary is not None else [], g._schedulers_of(primary),
                            g._scalers_all())

    def set_eps(self, eps: float) -> None:
        if self.opt is None:
            return
        for grp in self.opt.param_groups:
            if "eps" in grp and isinstance(grp["eps"], (int, float)) and grp["eps"] < 1e-12:
                grp["eps"] = eps

    def restore_state(self) -> dict[str, Any]:
        g = self.guard
        bufs = floating_buffers(g.watch.roots())
        if not bufs or all_finite(bufs):
            return {}
        src = g._buffer_copy
        if src is None and g.snapshots.last is not None:
            src = g.snapshots.last.buffers
        if src is None:
            return {}
        n = 0
        with torch.no_grad():
            for b, v in zip(bufs, src):
                if b.shape == v.shape and not bool(torch.isfinite(b).all()):
                    b.copy_(v)
                    n += 1
        return {"buffers_restored": n} if n else {}


def apply_settings(guard: Guard, params: Sequence[torch.Tensor], opt: torch.optim.Optimizer | None,
                   total_norm: float | None) -> None:
    """A healthy step under a back-off: clip, and scale the learning rate (or gradients)."""
    scale = guard.recovery_state.lr_scale
    clip = guard.recovery_state.clip_norm
    if clip is None and scale == 1.0:
        return  # no back-off in force: every healthy step of most runs
    with_grads = [p for p in params if p.grad is not None]
    if clip is not None and with_grads:
        clip_with_norm = getattr(torch.nn.utils, "clip_grads_with_norm_", None)
        if clip_with_norm is not None and total_norm is not None and math.isfinite(total_norm):
            # the fused check's norm is computed in float64: torch's own clip_grad_norm_
            # would overflow float32 on gradients above ~1e19 and scale them all by 0
            dev = with_grads[0].grad.device  # type: ignore[union-attr]
            clip_with_norm(with_grads, clip, torch.tensor(total_norm, dtype=torch.float64, device=dev))
        else:
            torch.nn.utils.clip_grad_norm_(with_grads, clip)
    if scale == 1.0:
        return
    if opt is not None:
        guard._saved_lrs = [grp["lr"] for grp in opt.param_groups]
        for grp in opt.param_groups:
            grp["lr"] = grp["lr"] * scale
    else:
        # a hand-written update reads the gradient: scale it instead of a learning rate
        grads = [p.grad for p in params if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, scale)


def maybe_snapshot(guard: Guard, before_update: bool) -> None:
    """Under ``skip``/``recover``: the first snapshot before the first update, then every
    ``snapshot_every`` steps after a healthy one (never of non-finite weights)."""
    if guard.policy == "raise":
        return
    roots = guard.watch.roots()
    if not before_update and roots and sum(b.numel() for b in floating_buffers(roots)) <= 1 << 20:
        guard._buffer_copy = [b.detach().clone() for b in floating_buffers(roots)]
    if before_update and guard.snapshots.last is not None:
        return
    if not before_update and not guard.snapshots.due(guard.step + 1):
        return
    opt = guard.watch.primary
    watched = guard.watch.params()
    if not before_update and not guard.controller.snapshot_ok():
        return  # the run is finite but not healthy by the controller's signals: not "good"
    if not all_finite(watched):
        return  # never keep non-finite weights as the "last good" state
    guard.snapshots.take(
        guard.step if before_update else guard.step + 1,
        watched,
        module_buffers(roots),
        [opt] if opt is not None else [],
        guard._schedulers_of(opt),
        guard._scalers_all(),
    )
