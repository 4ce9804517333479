"""What a torch guard does to the run: the only code that changes the user's objects.

* after a non-finite step (through the step controller): hide the gradients from
  ``optimizer.step()`` (handed back after it), roll back to the last snapshot, raise ``eps``, put
  back module buffers a bad batch poisoned, try fixes on the failing step (:mod:`._trial`);
* on every healthy step under a back-off (at the pre-step hook): clip at the switched-on
  threshold and multiply the learning rate by the back-off factor (taken out again after the
  step) — or, without an optimizer, scale the gradients;
* snapshots: before the first update, then every ``snapshot_every`` steps (skip/recover); under
  ``raise`` only while affordable, to try the advice from (:class:`~nanguard.core.snapbudget.SnapshotBudget`).
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..core.controller import StepController
from ..core.snapbudget import SnapshotBudget
from ..core.trials import Fix, Trial
from ._recorder import Event
from ._stats import all_finite
from ._watched import WatchSet
from .snapshot import SCHEDULERS, Snapshotter, floating_buffers, module_buffers

__all__ = ["Actuator"]


class Actuator:
    """Carries out the step controller's decisions and the back-off on the user's objects.

    Attributes:
        snapshots: the last known good states (CPU memory, or also a directory).
        schedulers, scalers: the LR schedulers and loss scalers whose state a snapshot holds.
        trialing: a fix is being tried on the failing step: the hooks stand aside.
    """

    def __init__(self, controller: StepController, watch: WatchSet, snapshots: Snapshotter,
                 schedulers: Sequence[Any] = (), scaler: Any = None) -> None:
        self.controller = controller
        self.watch = watch
        self.snapshots = snapshots
        self.schedulers: weakref.WeakSet[Any] = weakref.WeakSet(schedulers)
        self.scalers: weakref.WeakSet[Any] = weakref.WeakSet([scaler] if scaler is not None else [])
        self.trialing = False
        #: under ``raise``: when a snapshot to try the advice from is affordable
        self.budget = SnapshotBudget()
        #: a copy of the module buffers after the last healthy update (what restore_state puts back)
        self._buffer_copy: list[torch.Tensor] | None = None
        #: what this step changed and post_step gives back: gradients hidden, learning rates
        self._hidden_grads: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        self._saved_lrs: list[tuple[dict[str, Any], Any]] = []
        #: optimizers whose next update a rollback at another optimizer's step made stale
        self.stale: set[int] = set()

    @property
    def policy(self) -> str:
        return self.controller.config.policy

    # --- what a snapshot holds -----------------------------------------------------------------
    def schedulers_of(self, opt: torch.optim.Optimizer | None) -> list[Any]:
        found = list(self.schedulers) + [s for s in SCHEDULERS if s not in self.schedulers]
        return [s for s in found if opt is not None and getattr(s, "optimizer", None) is opt]

    def state_now(self) -> tuple[list[torch.Tensor], list[torch.Tensor], list[Any], list[Any], list[Any]]:
        """What a snapshot holds and a rollback restores, as :meth:`Snapshotter.copy` takes it:
        the weights and state of every optimizer of the run (an actor-critic's two), the module
        buffers, the optimizers' LR schedulers, the loss scalers."""
        opts = self.watch.optimizers()
        return (self.watch.state_params(), module_buffers(self.watch.roots()), opts,
                [s for o in opts for s in self.schedulers_of(o)], self.scalers_all())

    def _take(self, step: int) -> None:
        """A snapshot into the ring, restored later into the very objects it was taken of."""
        targets = self.state_now()
        self.snapshots.take(step, *targets).targets = targets

    def scalers_all(self) -> list[Any]:
        """The loss scalers of this guard's run: passed to ``attach(scaler=...)``, or seen scaling
        a loss or stepping while attached (a scaler merely alive in the process is not)."""
        return list(self.scalers)

    def forget_snapshots(self) -> None:
        """The step marker changed (backward() → the optimizer): what is restored changes too."""
        self.snapshots.last = None
        self._buffer_copy = None

    # --- after a non-finite step ---------------------------------------------------------------
    def skip_update(self, params: Sequence[torch.Tensor], opt: torch.optim.Optimizer | None) -> None:
        """Never apply this step's update: hide the gradients from the optimizer (given back
        after its step), or, before a hand-written update, zero them."""
        if opt is not None:
            self._hidden_grads = [(p, p.grad) for p in params]
            for p in params:
                p.grad = None
        else:
            for p in params:
                if p.grad is not None:
                    p.grad.zero_()

    def rollback(self, older: bool = False, current: torch.optim.Optimizer | None = None) -> int | None:
        """Restore the newest healthy snapshot (``older``: the one before it); its step. With
        several optimizers, every one but ``current`` (whose step this is) skips its next update:
        its gradients may come from a graph built on the weights the rollback replaced."""
        snap = self.snapshots.target(older)
        if snap is None:
            return None
        self.restore_to(snap)
        opts = (snap.targets or self.state_now())[2]
        if len(opts) > 1:
            self.stale = {id(o) for o in opts if o is not current}
        self.watch.state.ok = True  # a snapshot only ever holds finite weights
        return int(snap.step)

    def restore_to(self, snap: Any) -> None:
        params, buffers, opts, schedulers, scalers = snap.targets or self.state_now()
        Snapshotter.restore(snap, params, buffers, opts, schedulers, scalers, keep_versions=len(opts) > 1)

    def stale_step(self, opt: torch.optim.Optimizer) -> bool:
        """At an optimizer's check: is this its first update since a rollback taken at another
        optimizer's step (to be skipped)? Asked once."""
        if id(opt) not in self.stale:
            return False
        self.stale.discard(id(opt))
        return True

    def set_eps(self, opt: torch.optim.Optimizer | None, eps: float) -> None:
        if opt is None:
            return
        for grp in opt.param_groups:
            if "eps" in grp and isinstance(grp["eps"], (int, float)) and grp["eps"] < 1e-12:
                grp["eps"] = eps

    def set_weight_decay(self, opt: torch.optim.Optimizer | None, weight_decay: float) -> None:
        """Lower every parameter group's weight decay above ``weight_decay`` to it (a rollback
        for ``lr × weight_decay ≥ 1``; kept from then on, as ``eps`` is)."""
        if opt is None:
            return
        for grp in opt.param_groups:
            wd = grp.get("weight_decay")
            if isinstance(wd, (int, float)) and not isinstance(wd, bool) and wd > weight_decay:
                grp["weight_decay"] = weight_decay

    def restore_state(self) -> dict[str, Any]:
        """Module buffers (BatchNorm statistics) a bad batch made non-finite, put back from the
        copy after the last healthy update (or the last snapshot)."""
        bufs = floating_buffers(self.watch.roots())
        if not bufs or all_finite(bufs):
            return {}
        src = self._buffer_copy
        if src is None and self.snapshots.last is not None:
            src = self.snapshots.last.buffers
        if src is None:
            return {}
        n = 0
        with torch.no_grad():
            for b, v in zip(bufs, src):
                if b.shape == v.shape and not bool(torch.isfinite(b).all()):
                    b.copy_(v)
                    n += 1
        return {"buffers_restored": n} if n else {}

    def trial(self, events: Sequence[Event], params: Sequence[torch.Tensor], opt: torch.optim.Optimizer | None,
              fixes: list[Fix], script_clip: float | None, scaled: bool,
              hold: Callable[[bool], None], stop_early: bool = True) -> list[Trial] | None:
        """Try each fix from the newest snapshot on the failing step (:mod:`._trial`), leaving the
        run at that snapshot; ``None`` when the step cannot be re-run. ``stop_early``: stop at the
        first verified fix (every fix is tried when the ranks must then agree)."""
        from ._trial import run_trials

        snap = self.snapshots.last
        if snap is None or opt is None or scaled:
            return None
        state = self.controller.state
        # under ``raise`` nothing is rolled back: the run is left as it failed (the script may
        # catch the error and look at it) — a copy of it now, put back after the trials
        failed = self._copy_now(snap.step) if self.policy == "raise" else None
        self.trialing = True
        hold(True)
        try:
            return run_trials(events, params, opt, fixes, snap.step, lambda: self.restore_to(snap),
                              state.lr_scale, [c for c in (script_clip, state.clip_norm) if c is not None],
                              stop_early)
        finally:
            if failed is not None:
                self.restore_to(failed)
            hold(False)
            self.trialing = False

    def _copy_now(self, step: int) -> Any:
        targets = self.state_now()
        snap = Snapshotter.copy(step, *targets)
        snap.targets = targets
        return snap

    # --- every healthy step --------------------------------------------------------------------
    def apply_settings(self, params: Sequence[torch.Tensor], opt: torch.optim.Optimizer | None,
                       total_norm: float | None) -> None:
        """A healthy step under a back-off: clip, and scale the learning rate (or gradients)."""
        state = self.controller.state
        scale, clip = state.lr_scale, state.clip_norm
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
            self._saved_lrs = [(grp, grp["lr"]) for grp in opt.param_groups]
            for grp in opt.param_groups:
                grp["lr"] = grp["lr"] * scale
        else:
            # a hand-written update reads the gradient: scale it instead of a learning rate
            grads = [p.grad for p in params if p.grad is not None]
            if grads:
                torch._foreach_mul_(grads, scale)

    def give_back(self) -> None:
        """After the optimizer step: the learning rates and the hidden gradients, as they were
        (a back-off is a factor applied at each step, never stored)."""
        for group, lr in self._saved_lrs:  # the groups of the optimizer that stepped
            group["lr"] = lr
        self._saved_lrs = []
        for p, g in self._hidden_grads:
            p.grad = g
        self._hidden_grads = []

    def forget_hidden(self) -> None:
        """A loss scaler's skipped step: its gradients stay where the scaler left them."""
        self._hidden_grads = []

    def _advice_snapshot(self, step: int) -> None:
        """Under ``raise``, at a healthy step's check before its update: a snapshot to try the
        advice from, when one is due and affordable (:class:`~nanguard.core.snapbudget.SnapshotBudget`)."""
        budget = self.budget
        budget.tick(time.perf_counter())
        last = self.snapshots.last

        def nbytes() -> int:  # the weights, and about twice them of optimizer state (Adam's)
            return 3 * sum(p.numel() * p.element_size() for p in self.watch.state_params())

        # the cheap test first: on most healthy steps nothing else is read
        if not budget.due(step, None if last is None else last.step, self.snapshots.every, nbytes):
            return
        if not self.controller.snapshot_ok() or not all_finite(self.watch.state_params()):
            return
        t0 = time.perf_counter()
        self._take(step)
        self.snapshots.ring[:-1] = []  # one is enough to try the advice from
        budget.cost = time.perf_counter() - t0

    def maybe_snapshot(self, step: int, before_update: bool, primary: bool = True) -> None:
        """Under ``skip``/``recover``: the first snapshot before the first update, then every
        ``snapshot_every`` steps after a healthy one (never of non-finite weights); one wanted
        by the controller (a raise of the back-off began) at the first healthy check of any
        optimizer (``primary`` False: another optimizer's step, for that one only)."""
        if self.policy == "raise":
            if before_update and primary:
                self._advice_snapshot(step)
            return
        if not primary:
            if before_update and self.controller.snapshot_wanted() and all_finite(self.watch.state_params()):
                self._take(step)
            return
        roots = self.watch.roots()
        if not before_update and roots and sum(b.numel() for b in floating_buffers(roots)) <= 1 << 20:
            self._buffer_copy = [b.detach().clone() for b in floating_buffers(roots)]
        at = step if before_update else step + 1
        if self.controller.snapshot_wanted():  # a raised learning rate is tried from here
            if all_finite(self.watch.state_params()):
                self._take(at)
            return
        first = self.snapshots.last is None
        # after the first, snapshots are taken after a healthy update — or, where no optimizer
        # step is seen (a hand-written update), at the check before it, as often
        if before_update and not first and (self.watch.primary is not None or not self.snapshots.due(step)):
            return
        if not before_update and not self.snapshots.due(step + 1):
            return
        if (not before_update or not first) and not self.controller.snapshot_ok():
            return  # the run is finite but not healthy by the controller's signals: not "good"
        if not all_finite(self.watch.state_params()):
            return  # never keep non-finite weights as the "last good" state
        self._take(at)
