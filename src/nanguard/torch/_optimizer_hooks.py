"""The torch guard's hooks around each ``optimizer.step()`` (torch's global step hooks).

* pre-step: ONE fused check of the step's loss(es) and gradients (with ``raise``: and the
  weights the previous update left, when they may have moved: ``_watched.weights_wanted``, or
  when the check fails); a closure (LBFGS, Lightning, SAM) is wrapped so that the
  check runs after it computed the gradients; a failure is located, diagnosed and handed to the
  step controller; a healthy step gets the back-off and the clipping, if switched on.
* post-step: the hidden gradients and learning rates given back; under ``skip``/``recover`` the
  weights checked right after the update; the step's history record; the step ends.

Every optimizer's step is a step. A step that raises is ended cleanly (``_abort_step``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

from ..core.diagnosis import diagnose
from . import _dist
from ._backend import apply_settings, maybe_snapshot
from ._deferred import deferred_wanted
from ._findings import optimizer_finding, parameter_finding
from ._guard_base import GuardBase, param_norm
from ._watched import opt_params, weights_wanted
from .watch import NormCheck, check, check_params

__all__ = ["OptimizerHooks"]


class OptimizerHooks(GuardBase):
    """Registered with ``torch.optim.optimizer.register_optimizer_step_pre/post_hook``."""

    def _adopt_primary(self, opt: torch.optim.Optimizer) -> None:
        """The first optimizer seen (at its step, or at a loss scaler's step that skipped it)
        becomes the step marker; backward() calls counted as steps before it join its step."""
        self.watch.primary = opt
        # a snapshot taken while backward() was the step marker lists graph leaves, in graph
        # order: from now on the optimizer's parameters are what is restored
        self.snapshots.last = None
        self._buffer_copy = None
        if self._backward_steps:
            # the backward() calls before the first optimizer step were counted as steps
            # (there might have been no optimizer at all); with gradient accumulation there
            # are several: they all belong to this one optimizer step
            n = self._backward_steps
            self.step = max(0, self.step - n)
            losses = [r.loss for r in (self.history.pop() for _ in range(n)) if r is not None]
            finite = [v for v in losses if v is not None]
            self._carry_loss = math.fsum(finite) if finite else None
            for fn in self.on_step_end:
                fn()
        self._backward_steps = 0
        self.watch.leaves = None

    def _pre_step(self, opt: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._trialing or (self.optimizer is not None and opt is not self.optimizer):
            return None
        self.recorder.paused += 1
        self.recorder.tape_off()
        self._in_opt_step = True
        self._settings_applied = False
        if self.watch.primary is None:
            self._adopt_primary(opt)
        self.watch.optimizer_name(opt)
        self.step_was_skipped = False
        closure, where = _closure_of(opt, args, kwargs)
        self._closure_step = closure is not None  # checked after each closure call: synchronously
        if closure is not None:
            # the gradients exist only once the closure ran (LBFGS, Lightning, SAM): check then
            wrapped = self._checked_closure(opt, closure)
            if where >= 0:
                return (*args[:where], wrapped, *args[where + 1:]), kwargs
            return args, {**kwargs, "closure": wrapped}
        try:
            self._check(opt)
        except BaseException:
            self._abort_step(opt)
            raise
        return None

    def _checked_closure(self, opt: torch.optim.Optimizer, closure: Callable[[], Any]) -> Callable[[], Any]:
        def checked() -> Any:
            # the closure's forward and backward are the step's: record them, like a step
            self.recorder.paused = max(0, self.recorder.paused - 1)
            self.recorder.new_step()
            self._losses, self._unscaled, self._clip_norms, self._sinks = [], [], [], []
            self._in_closure = True
            if not self.recorder.paused and not self.modules.depth:
                self.recorder.tape_on()
            try:
                out = closure()
            finally:
                self._in_closure = False
                self.recorder.paused += 1
                self.recorder.tape_off()
            try:
                self._check(opt)
            except BaseException:
                self._abort_step(opt)
                raise
            return out

        return checked

    def _check(self, opt: torch.optim.Optimizer) -> None:
        """The fused check of the step's loss(es) and gradients, before the update; with policy
        ``raise`` it also reads the weights the previous update left (one synchronisation)."""
        self.hazards_sample_end()  # a sampled step's forward and backward are done
        params = opt_params(opt)
        if not any(p.grad is not None for p in params) and not self._losses:
            return  # nothing computed yet (a closure-based optimizer computes it inside step())
        primary = opt is self.watch.primary
        if self._defer is None:
            self._defer = deferred_wanted(params, self.policy)
        # a loss scaler of this run reads its own flag and skips by itself: checked as before
        if (self._defer and primary and not self._closure_step and not (self._unscaled or len(self._scalers))
                and not _dist.active()):
            self._check_deferred(opt, params)  # no host read: this step is read at the next one
            return
        self._n_losses = len(self._losses)
        # the state too: periodically, and whenever the last update's gradients were large enough
        # for their squares to overflow float32 in it (Adam's exp_avg_sq, Adagrad's sum)
        last_gn = self.history[-1].grad_norm if len(self.history) else None
        every = self.cadence.every  # 8-64 steps: what the reads may cost (``ReadCadence``)
        with_state = self.step % (2 * every) == 0 or (last_gn is not None and not last_gn < 1e17)
        due = self._params_due and primary and (
            with_state or weights_wanted(self.history, self.step, every, self._weights_read))
        weights, wnames = self.watch.weights(opt, with_state) if due else ([], [])
        t0 = time.perf_counter()
        chk, pchk = check([p.grad for p in params], [*self._losses, *self._clip_norms], weights)
        if primary:
            self.cadence.timed(time.perf_counter() - t0, bool(weights), self.update_replay.step_time)
        if pchk is None and not chk.finite and self._params_due and primary:
            # not read with the gradients this step: the failure needs to know whether the last
            # update left them non-finite (its finding then blames that update)
            weights, wnames = self.watch.weights(opt, True)
            pchk = check_params(weights)
        if pchk is not None:
            self._weights_checked(opt, pchk, wnames)
        if not chk.finite and not chk.bad and self._scalers_all() and not self._loss_bad() and \
                not any(math.isnan(v) for v in chk.losses):
            # a GradScaler scaled the loss until it overflowed, but the unscaled gradients it
            # passed on are finite: the scaler's business, not a failure (a NaN loss still is)
            chk.finite = True
        self._pending = chk
        ok, bad_ranks = _dist.agree(chk.finite and self._deferred is None, params)
        if ok:
            if self.policy == "raise" or not primary:
                self.controller.healthy()
            if primary:
                maybe_snapshot(self, before_update=True)
            if not self._settings_applied:
                self._settings_applied = True
                apply_settings(self, params, opt, chk.norm)
            if primary:
                self.update_replay.keep(opt, params, self.step, self.history, chk.norm)
            return
        if self._deferred is not None:
            # the previous update made the weights non-finite (found after it): act on it now
            # that every rank agrees
            finding, diag = self._deferred
            self._deferred = None
            if _dist.active():
                finding, diag = _dist.share(finding, diag, bad_ranks)
            self._act(finding, diag, params, opt, rollback_weights=True)
            return
        self._failure(chk, params, bad_ranks, opt=opt)

    def _weights_checked(self, opt: torch.optim.Optimizer, pchk: NormCheck, wnames: list[str]) -> None:
        """Policy ``raise``: the weights the previous update left, read with this step's check."""
        self._params_due = False
        self._weights_ok = pchk.finite
        if len(self.history) and self._updated:
            self._note_weights(param_norm(pchk, wnames))
            if pchk.finite:
                self.controller.early.observe(self.history)  # the weight rules, a step sooner
        if pchk.finite or self._deferred is not None:
            return
        if self._updated:
            f = optimizer_finding(self, opt, pchk, self._last_update_step, wnames)
        else:
            f = parameter_finding(self, pchk, wnames)
        self._deferred = (f, diagnose(f, self._history_for(opt), self.context(opt)))

    def _post_step(self, opt: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self._trialing or (self.optimizer is not None and opt is not self.optimizer):
            return
        self._in_opt_step = False
        self.recorder.paused = max(0, self.recorder.paused - 1)
        self._give_back()
        primary = opt is self.watch.primary
        deferred = self._inflight if primary else None
        if primary:
            self._deferred_after_step()
        if primary and not self.step_was_skipped:
            self._updated = True
            self._last_update_step = self.step
        if self.policy == "raise" or not primary:
            if primary:
                self._params_due = True  # checked with the next step's gradients
            self._record(self._pending, None, opt)
            if deferred is not None and deferred is self._inflight:
                deferred.record = self.history[-1]  # filled in when its numbers are read
            self._end_step()
        else:
            self._check_after_update(opt)
        if self.verify and primary and self.policy != "raise":
            self._verify(opt)
        if not self.recorder.paused and not self.modules.depth and not self.recorder.held_by_region:
            self.recorder.tape_on()

    def _check_after_update(self, opt: torch.optim.Optimizer) -> None:
        """``skip``/``recover``: the weights and state right after every update."""
        params = opt_params(opt)
        weights, wnames = self.watch.weights(opt)
        pchk = check_params(weights)
        pchk.norm = param_norm(pchk, wnames)
        was_ok, self._weights_ok = self._weights_ok, pchk.finite
        try:
            if not pchk.finite and not self.step_was_skipped:
                if was_ok is False:
                    # the weights were non-finite before this update: not the optimizer's doing
                    finding = parameter_finding(self, pchk, wnames)
                else:
                    finding = optimizer_finding(self, opt, pchk, self.step, wnames)
                diag = diagnose(finding, self._history_for(opt), self.context(opt))
                if _dist.active():
                    self._deferred = (finding, diag)  # every rank must agree: act at the next check
                else:
                    self._act(finding, diag, params, opt, rollback_weights=was_ok is not False,
                              after_update=True)
            elif pchk.finite:
                if not self.step_was_skipped:
                    self.controller.healthy()  # gradients and the update both checked
                maybe_snapshot(self, before_update=False)
        finally:
            self._record(self._pending, pchk, opt)
            self._end_step()


def _closure_of(opt: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
                ) -> tuple[Callable[[], Any] | None, int]:
    """``optimizer.step(closure)``'s closure and its position in ``args`` (-1: a keyword).
    torch's step hooks get the optimizer itself as ``args[0]``."""
    c = kwargs.get("closure")
    if callable(c):
        return c, -1
    i = 1 if args and args[0] is opt else 0
    if len(args) > i and callable(args[i]):
        return args[i], i
    return None, -1
