"""The torch guard's deferred watch (no host sync on a healthy step; see ``_deferred``): the
check of step N is started on the device at its pre-step hook and read at step N+1's (or when
the guard detaches); a failure is then replayed, diagnosed and raised for step N.
"""

from __future__ import annotations

import math

import torch

from ..core.diagnosis import diagnose
from ._deferred import InFlight, device_check, masked_step, to_host
from ._findings import optimizer_finding, parameter_finding
from ._guard_base import GuardBase, param_norm
from ._watched import opt_params
from .watch import NormCheck

__all__ = ["DeferredHooks"]


class DeferredHooks(GuardBase):
    """``_check_deferred`` (pre-step), ``_deferred_after_step`` (post-step), ``resolve_inflight``."""

    def _check_deferred(self, opt: torch.optim.Optimizer, params: list[torch.Tensor]) -> None:
        prev, self._inflight = self._inflight, None
        if prev is not None:
            self._resolve(prev)  # the previous step, read now: raises on a failure
        self._n_losses = len(self._losses)
        due = self._params_due
        self._params_due = False
        last_gn = self.history[-1].grad_norm if len(self.history) else None
        with_state = self.step % self.STATE_CHECK_EVERY == 0 or (last_gn is not None and not last_gn < 1e17)
        weights, wnames = self.watch.weights(opt, with_state) if due else ([], [])
        stats, bad, gi, pi = device_check([p.grad for p in params], [*self._losses, *self._clip_norms],
                                          weights)
        if stats is None or bad is None:
            return
        host, ev = to_host(stats)
        self._mask = masked_step(opt, bad)
        self._mask.before()
        self._inflight = InFlight(self.step, host, ev, len(gi), len(pi), gi, pi,
                                  [wnames[i] for i in pi], self.recorder.events, list(self._sinks), opt)
        self._inflight.n_losses = self._n_losses

    def _deferred_after_step(self) -> None:
        """Post-step: the masked update finished; the step's record waits for its numbers."""
        mask, self._mask = self._mask, None
        if mask is not None:
            mask.after()
            if self._inflight is not None:
                self._inflight.host_state = mask.host_state

    def resolve_inflight(self) -> None:
        """Read the last step's check now (the guard detaches, or the run ends)."""
        prev, self._inflight = self._inflight, None
        if prev is not None:
            self._resolve(prev)

    def _resolve(self, f: InFlight) -> None:
        vals = f.values()
        ng, nw = f.n_grads, f.n_weights
        gper, wper, lvals = vals[:ng], vals[ng:ng + nw], vals[ng + nw:]
        gchk = _made(gper, f.gi, lvals)
        rec = f.record
        if rec is not None:
            n = min(f.n_losses, len(lvals))
            rec.loss = math.fsum(lvals[:n]) if n else rec.loss
            rec.grad_norm = gchk.norm
            if gchk.per_tensor:
                rec.layer_values = gchk.per_tensor
                rec.layer_names = self.watch.layer_names(gchk.index)
        pchk = _made(wper, f.pi, []) if nw else None
        if pchk is not None and rec is not None and len(self.history) > 1:
            self.history[-2].param_norm = param_norm(pchk, f.wnames)
        if gchk.finite and (pchk is None or pchk.finite):
            self.controller.healthy()
            return
        if rec is not None:
            rec.finite = False
            rec.skipped = True  # the update was skipped on the device
        with torch.no_grad():
            for t, old in f.host_state:  # state on another device than the flag (CPU counters)
                t.copy_(old)
        self._act_on_previous(f, gchk, pchk)

    def _act_on_previous(self, f: InFlight, gchk: NormCheck, pchk: NormCheck | None) -> None:
        params = opt_params(f.opt)
        saved = (self.step, self.recorder.events, self._sinks)
        self.step, self.recorder.events, self._sinks = f.step, f.events, f.sinks
        try:
            if pchk is not None and not pchk.finite:
                wn = f.wnames
                pchk.bad = [i for i, v in enumerate(pchk.per_tensor) if not math.isfinite(v)]
                if self._updated:
                    finding = optimizer_finding(self, f.opt, pchk, self._last_update_step - 1, wn)
                else:
                    finding = parameter_finding(self, pchk, wn)
                diag = diagnose(finding, self._history_for(f.opt), self.context(f.opt))
                self._act(finding, diag, params, f.opt, rollback_weights=True)
                return
            self._failure(gchk, params, [], f.opt)
        finally:
            self.step, self.recorder.events, self._sinks = saved


def _made(per: list[float], index: list[int], lvals: list[float]) -> NormCheck:
    """A :class:`NormCheck` from numbers read back (no exact pass: the tensors have moved on; a
    norm that overflowed on finite values counts as non-finite, and the replay decides)."""
    bad = [index[j] for j, v in enumerate(per) if not math.isfinite(v)]
    finite = not bad and all(math.isfinite(v) for v in lvals)
    sq = math.fsum(v * v for v in per) if per else 0.0
    norm = math.sqrt(sq) if per and math.isfinite(sq) else (float("inf") if per else None)
    return NormCheck(finite, norm, per, lvals, bad, index)
