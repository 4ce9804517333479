"""The torch guard's hooks around each ``optimizer.step()`` (torch's global step hooks).

* pre-step: ONE fused check of the step's loss(es) and gradients (with ``raise``: and the
  weights the previous update left, when they may have moved: ``_watched.weights_wanted``, or
  when the check fails); a closure (LBFGS, Lightning, SAM) is wrapped so that the check runs
  after it computed the gradients. The reading goes to the step driver (``core/step.py``),
  which acts on a failure and gives a healthy step the back-off in force.
* post-step: the hidden gradients and learning rates given back; under ``skip``/``recover`` the
  weights checked right after the update; the step's history record; the step ends.

Every optimizer's step is a step. A step that raises is ended cleanly (:meth:`abort`).
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ..core.diagnosis import Diagnosis
from ..core.early import eps_zero
from ..core.finding import Finding
from . import _dist
from ._deferred import deferred_wanted
from ._deferred_hooks import DeferredWatch, param_norm
from ._step import TorchStep, Where
from ._watched import opt_params, weights_wanted
from .watch import NormCheck, check, check_params

if TYPE_CHECKING:
    from .guard import Guard

__all__ = ["OptimizerHooks"]

#: torch optimizers whose update divides by a root of a squared-gradient average plus ``eps``
_DIVIDES_BY_ROOT = frozenset({"Adam", "AdamW", "Adamax", "NAdam", "RAdam", "SparseAdam", "RMSprop",
                              "Adagrad", "Adadelta"})


class OptimizerHooks:
    """Registered with ``torch.optim.optimizer.register_optimizer_step_pre/post_hook``."""

    def __init__(self, guard: Guard, step: TorchStep) -> None:
        self.g = guard
        self.step = step
        #: the deferred watch (no host sync per step), decided at the first check
        self.defer: bool | None = None
        self.deferred = DeferredWatch(guard.driver, guard.watch, guard.recorder, guard.replayer, guard.port)
        #: a failure found before this step's check (the last update left the weights
        #: non-finite), acted on at the check, once every rank agrees
        self.prior: tuple[Finding, Diagnosis] | None = None
        self._seen: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()

    def _first_sight(self, opt: torch.optim.Optimizer) -> None:
        """Before an optimizer's first update: a configuration that can make a NaN by itself
        (``eps=0`` where the update divides by a root of the squared-gradient average)."""
        self._seen.add(opt)
        if self.g.watch.add_optimizer(opt):
            # a second optimizer (an actor-critic's actor): the next snapshot holds its weights
            # and state too — a rollback that restored the critic alone left the actor diverged
            self.g.actuator.forget_snapshots()
        if type(opt).__name__ not in _DIVIDES_BY_ROOT:
            return
        zero = [i for i, grp in enumerate(opt.param_groups)
                if isinstance(grp.get("eps"), (int, float)) and grp["eps"] == 0]
        if zero:
            call = f"torch.optim.{type(opt).__name__}(eps=0)"
            self.g.controller.early.add(eps_zero(call, zero, len(opt.param_groups), self.g.driver.step))

    def adopt_primary(self, opt: torch.optim.Optimizer) -> None:
        """The first optimizer seen (at its step, or at a loss scaler's step that skipped it)
        becomes the step marker; backward() calls counted as steps before it join its step."""
        g = self.g
        g.watch.primary = opt
        # a snapshot taken while backward() was the step marker lists graph leaves, in graph
        # order: from now on the optimizer's parameters are what is restored
        g.actuator.forget_snapshots()
        n = g.watch.backward_steps
        if n:
            # the backward() calls before the first optimizer step were counted as steps
            # (there might have been no optimizer at all); with gradient accumulation there
            # are several: they all belong to this one optimizer step
            g.driver.step = max(0, g.driver.step - n)
            losses = [r.loss for r in (g.history.pop() for _ in range(n)) if r is not None]
            finite = [v for v in losses if v is not None]
            self.step.carry_loss = math.fsum(finite) if finite else None
            for fn in g.driver.on_end:
                fn()
        g.watch.backward_steps = 0
        g.watch.leaves = None

    def _mine(self, opt: torch.optim.Optimizer) -> bool:
        return not self.g.actuator.trialing and (self.g.optimizer is None or opt is self.g.optimizer)

    def pre(self, opt: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not self._mine(opt):
            return None
        g, st = self.g, self.step
        if st.where is not Where.OUTSIDE:
            self.abandon()  # the last optimizer step raised inside torch's step: it never ended
        g.recorder.hold()
        st.held = True
        st.enter(Where.OPTIMIZER)
        st.settings_applied = False
        if g.watch.primary is None:
            self.adopt_primary(opt)
        if opt not in self._seen:
            self._first_sight(opt)
        g.watch.optimizer_name(opt)
        g.driver.begin()
        closure, where = _closure_of(opt, args, kwargs)
        st.closure = closure is not None  # checked after each closure call: synchronously
        if closure is not None:
            # the gradients exist only once the closure ran (LBFGS, Lightning, SAM): check then
            wrapped = self._checked_closure(opt, closure)
            if where >= 0:
                return (*args[:where], wrapped, *args[where + 1:]), kwargs
            return args, {**kwargs, "closure": wrapped}
        try:
            self.check(opt)
        except BaseException:
            self.abort(opt)
            raise
        return None

    def _checked_closure(self, opt: torch.optim.Optimizer, closure: Callable[[], Any]) -> Callable[[], Any]:
        g, st = self.g, self.step

        def checked() -> Any:
            # the closure's forward and backward are the step's: record them, like a step
            g.recorder.release()
            st.held = False
            g.recorder.new_step()
            st.restart()
            st.enter(Where.CLOSURE)
            try:
                out = closure()
            except BaseException:
                self.abandon()  # the script's own error: the step ends, nothing recorded
                raise
            st.enter(Where.OPTIMIZER)
            g.recorder.hold()
            st.held = True
            try:
                self.check(opt)
            except BaseException:
                self.abort(opt)
                raise
            return out

        return checked

    def check(self, opt: torch.optim.Optimizer) -> None:
        """The fused check of the step's loss(es) and gradients, before the update; with policy
        ``raise`` it also reads the weights the previous update left (one synchronisation)."""
        g, st = self.g, self.step
        g.hazards.sample_end(g.driver.step)  # a sampled step's forward and backward are done
        params = opt_params(opt)
        if not any(p.grad is not None for p in params) and not st.losses:
            return  # nothing computed yet (a closure-based optimizer computes it inside step())
        primary = opt is g.watch.primary
        if g.actuator.stale_step(opt):
            st.check = NormCheck(True, None)
            g.driver.stale(g.port(params, opt, st.check, st.sinks))
            return
        if self.defer is None:
            self.defer = deferred_wanted(params, g.policy)
        st.n_losses = len(st.losses)
        # a loss scaler of this run reads its own flag and skips by itself: checked as before
        if (self.defer and primary and not st.closure and not (st.unscaled or g.actuator.scalers_all())
                and not _dist.active()):
            # no host read: this step is read at the next one
            self.deferred.start(opt, params, [*st.losses, *st.clip_norms], st.sinks, st.n_losses)
            return
        chk, pchk, wnames = self._read(opt, params, primary)
        port = g.port(params, opt, chk, st.sinks)
        if pchk is not None:
            self._weights_checked(opt, pchk, wnames, port)
        if not chk.finite and not chk.bad and g.actuator.scalers_all() and not g.bwd_hooks.loss_bad() and \
                not any(math.isnan(v) for v in chk.losses):
            # a GradScaler scaled the loss until it overflowed, but the unscaled gradients it
            # passed on are finite: the scaler's business, not a failure (a NaN loss still is)
            chk.finite = True
        st.check = chk
        prior, self.prior = self.prior, None
        ok = g.driver.check(chk.finite, port, checks_after=g.policy != "raise" and primary, prior=prior)
        if ok and primary:
            g.replayer.updates.keep(opt, params, g.driver.step, g.history, chk.norm)

    def _read(self, opt: torch.optim.Optimizer, params: list[torch.Tensor], primary: bool
              ) -> tuple[NormCheck, NormCheck | None, list[str]]:
        """One fused read of the gradients and losses — and, when due, the weights and state."""
        g, st = self.g, self.step
        ws = g.watch.state
        history, step = g.history, g.driver.step
        # the state too: periodically, and whenever the last update's gradients were large enough
        # for their squares to overflow float32 in it (Adam's exp_avg_sq, Adagrad's sum)
        last_gn = history[-1].grad_norm if len(history) else None
        every = ws.cadence.every  # 8-64 steps: what the reads may cost (``ReadCadence``)
        with_state = step % (2 * every) == 0 or (last_gn is not None and not last_gn < 1e17)
        due = ws.due and primary and (with_state or weights_wanted(history, step, every, ws.read))
        weights, wnames = g.watch.weights(opt, with_state) if due else ([], [])
        t0 = time.perf_counter()
        chk, pchk = check([p.grad for p in params], [*st.losses, *st.clip_norms], weights)
        if primary:
            ws.cadence.timed(time.perf_counter() - t0, bool(weights), g.replayer.updates.step_time)
        if pchk is None and not chk.finite and ws.due and primary:
            # not read with the gradients this step: the failure needs to know whether the last
            # update left them non-finite (its finding then blames that update)
            weights, wnames = g.watch.weights(opt, True)
            pchk = check_params(weights)
        return chk, pchk, wnames

    def _weights_checked(self, opt: torch.optim.Optimizer, pchk: NormCheck, wnames: list[str], port: Any) -> None:
        """Policy ``raise``: the weights the previous update left, read with this step's check."""
        g = self.g
        ws = g.watch.state
        ws.due = False
        ws.ok = pchk.finite
        if len(g.history) and ws.updated:
            g.note_weights(param_norm(pchk, wnames))
            if pchk.finite:
                g.controller.early.observe(g.history)  # the weight rules, a step sooner
        if pchk.finite or self.prior is not None:
            return
        wrote = g.replayer.script_write(pchk, g.watch.weights(opt)[0]) if ws.updated else None
        if wrote is not None:  # not the update's doing: the script wrote into them since
            f = g.replayer.parameter_finding(
                pchk, wnames, g.driver.step,
                note=f"the script wrote into these weights at {wrote} after the last update (step "
                     f"{ws.last_update_step}): they were non-finite when this step began")
        elif ws.updated:
            f = g.replayer.optimizer_finding(opt, pchk, ws.last_update_step, wnames, None)
        else:
            f = g.replayer.parameter_finding(pchk, wnames, g.driver.step)
        self.prior = (f, g.driver.diagnose(f, port))

    def post(self, opt: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not self._mine(opt):
            return
        g, st = self.g, self.step
        st.enter(Where.OUTSIDE)
        if st.held:
            g.recorder.release(push=False)
            st.held = False
        g.actuator.give_back()
        primary = opt is g.watch.primary
        deferred = self.deferred.inflight if primary else None
        if primary:
            self.deferred.after_step()
        if primary and not g.driver.skipped:
            g.watch.state.update_applied(g.driver.step)
        if g.policy == "raise" or not primary:
            if primary:
                g.watch.state.due = True  # checked with the next step's gradients
            rec = g.end_step(st.check, None, opt)
            if deferred is not None and deferred is self.deferred.inflight:
                deferred.record = rec  # filled in when its numbers are read
        else:
            self._check_after_update(opt)
        if primary and g.policy != "raise":
            g.verifier.after_step(g, opt)
        if not g.recorder.paused and not g.modules.depth and not g.recorder.held_by_region:
            g.recorder.tape_on()

    def _check_after_update(self, opt: torch.optim.Optimizer) -> None:
        """``skip``/``recover``: the weights and state right after every update."""
        g, st = self.g, self.step
        weights, wnames = g.watch.weights(opt)
        pchk = check_params(weights)
        pchk.norm = param_norm(pchk, wnames)
        ws = g.watch.state
        was_ok, ws.ok = ws.ok, pchk.finite
        port = g.port(opt_params(opt), opt, st.check or NormCheck(True, None), st.sinks)
        step = g.driver.step

        def finding() -> Finding:
            if was_ok is False:
                # the weights were non-finite before this update: not the optimizer's doing
                return g.replayer.parameter_finding(pchk, wnames, step)
            return g.replayer.optimizer_finding(opt, pchk, step, wnames, st.check)

        def later(f: Finding, d: Diagnosis) -> None:
            self.prior = (f, d)  # every rank must agree: act at the next check

        try:
            g.driver.check_after(pchk.finite, port, finding, rollback_weights=was_ok is not False,
                                 later=later if _dist.active() else None)
        finally:
            g.end_step(st.check, pchk, opt)

    def abort(self, opt: torch.optim.Optimizer | None) -> None:
        """The step raised (a finding under ``raise``, a give-up, or the script's own error in a
        closure): end it cleanly, so that a script that catches the error and goes on starts its
        next step with nothing stale (losses, hidden gradients, a held recorder)."""
        g, st = self.g, self.step
        st.where = Where.OUTSIDE
        if st.held:
            g.recorder.release(push=False)
            st.held = False
        g.actuator.give_back()
        g.end_step(st.check, None, opt, finite=False)
        if not g.recorder.paused and not g.modules.depth:
            g.recorder.tape_on()

    def abandon(self) -> None:
        """The script's own error inside ``optimizer.step()`` (its closure raised): the step ends
        with nothing recorded of it, its holds released, nothing of it left for the next."""
        g, st = self.g, self.step
        held = st.held
        st.reset()
        if held:
            g.recorder.release(push=False)
        g.actuator.give_back()
        g.recorder.new_step()
        g.driver.abandon()
        if not g.recorder.paused and not g.modules.depth:
            g.recorder.tape_on()


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
