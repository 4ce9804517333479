"""The torch guard's deferred watch (no host sync on a healthy step; see ``_deferred``): the
check of step N is started on the device at its pre-step hook and read at step N+1's (or when
the guard detaches); a failure is then replayed, diagnosed and raised for step N — with step
N's own recorded events and sinks, passed explicitly (nothing of step N+1 is swapped out).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..core.step import StepDriver
from ._deferred import InFlight, device_check, masked_step, to_host
from ._recorder import StepRecorder
from ._watched import WatchSet, opt_params
from .replay import Replayer
from .watch import NormCheck

__all__ = ["STATE_CHECK_EVERY", "DeferredWatch", "param_norm"]

#: the deferred watch (GPU) checks the optimizer state every this many steps (the synchronous
#: one every ``2 · ReadCadence.every``, the weights when ``_watched.weights_wanted``): each check
#: reads the tensors once
STATE_CHECK_EVERY = 16


class DeferredWatch:
    """Starts each step's check on the device and reads it one step later."""

    def __init__(self, driver: StepDriver, watch: WatchSet, recorder: StepRecorder, replayer: Replayer,
                 port: Callable[..., object]) -> None:
        self.driver = driver
        self.watch = watch
        self.recorder = recorder
        self.replayer = replayer
        self._port = port  # makes the step port for a past step's failure (the hooks')
        self.inflight: InFlight | None = None
        self._mask: masked_step | None = None

    @property
    def idle(self) -> bool:
        """No step's check is on the device waiting to be read, and no update is masked."""
        return self.inflight is None and self._mask is None

    def start(self, opt: torch.optim.Optimizer, params: list[torch.Tensor], losses: list[torch.Tensor],
              sinks: list[object], n_losses: int) -> None:
        """Pre-step: read the previous step's check (raises on its failure), start this one's."""
        prev, self.inflight = self.inflight, None
        if prev is not None:
            self._resolve(prev)
        ws = self.watch.state
        due = ws.due
        ws.due = False
        history = self.driver.controller.history
        last_gn = history[-1].grad_norm if len(history) else None
        step = self.driver.step
        with_state = step % STATE_CHECK_EVERY == 0 or (last_gn is not None and not last_gn < 1e17)
        weights, wnames = self.watch.weights(opt, with_state) if due else ([], [])
        stats, bad, gi, pi = device_check([p.grad for p in params], losses, weights)
        if stats is None or bad is None:
            return
        host, ev = to_host(stats)
        self._mask = masked_step(opt, bad)
        self._mask.before()
        self.inflight = InFlight(step, host, ev, len(gi), len(pi), gi, pi, [wnames[i] for i in pi],
                                 self.recorder.events, list(sinks), opt)
        self.inflight.n_losses = n_losses

    def after_step(self) -> None:
        """Post-step: the masked update finished; the step's record waits for its numbers."""
        mask, self._mask = self._mask, None
        if mask is not None:
            mask.after()
            if self.inflight is not None:
                self.inflight.host_state = mask.host_state

    def resolve(self) -> None:
        """Read the last step's check now (the guard detaches, or the run ends)."""
        prev, self.inflight = self.inflight, None
        if prev is not None:
            self._resolve(prev)

    def _resolve(self, f: InFlight) -> None:
        vals = f.values()
        ng, nw = f.n_grads, f.n_weights
        gper, wper, lvals = vals[:ng], vals[ng:ng + nw], vals[ng + nw:]
        gchk = _made(gper, f.gi, lvals)
        rec = f.record
        history = self.driver.controller.history
        if rec is not None:
            n = min(f.n_losses, len(lvals))
            rec.loss = math.fsum(lvals[:n]) if n else rec.loss
            rec.grad_norm = gchk.norm
            if gchk.per_tensor:
                rec.layer_values = gchk.per_tensor
                rec.layer_names = self.watch.layer_names(gchk.index)
        pchk = _made(wper, f.pi, []) if nw else None
        if pchk is not None and rec is not None and len(history) > 1:
            history[-2].param_norm = param_norm(pchk, f.wnames)
        if gchk.finite and (pchk is None or pchk.finite):
            self.driver.controller.healthy()
            return
        if rec is not None:
            rec.finite = False
            rec.skipped = True  # the update was skipped on the device
        with torch.no_grad():
            for t, old in f.host_state:  # state on another device than the flag (CPU counters)
                t.copy_(old)
        self._act_on(f, gchk, pchk)

    def _act_on(self, f: InFlight, gchk: NormCheck, pchk: NormCheck | None) -> None:
        """Step ``f.step`` failed: located with its own events and sinks, diagnosed, acted on."""
        params = opt_params(f.opt)
        port = self._port(params, f.opt, gchk, f.sinks, f.step, f.events)
        ws = self.watch.state
        if pchk is not None and not pchk.finite:
            pchk.bad = [i for i, v in enumerate(pchk.per_tensor) if not math.isfinite(v)]
            if ws.updated:
                finding = self.replayer.optimizer_finding(f.opt, pchk, ws.last_update_step - 1, f.wnames, None)
            else:
                finding = self.replayer.parameter_finding(pchk, f.wnames, f.step)
            self.driver.act(finding, self.driver.diagnose(finding, port), port,  # type: ignore[arg-type]
                            rollback_weights=True, step=f.step)
            return
        self.driver.fail(port, step=f.step)  # type: ignore[arg-type]


def param_norm(chk: NormCheck, names: list[str]) -> float | None:
    """The weights' 2-norm from a check over weights and optimizer state."""
    vals = [v for v, n in zip(chk.per_tensor, names) if ":" not in n]
    if not vals:
        return chk.norm
    sq = math.fsum(v * v for v in vals)
    return math.sqrt(sq) if math.isfinite(sq) else float("inf")


def _made(per: list[float], index: list[int], lvals: list[float]) -> NormCheck:
    """A :class:`NormCheck` from numbers read back (no exact pass: the tensors have moved on; a
    norm that overflowed on finite values counts as non-finite, and the replay decides)."""
    bad = [index[j] for j, v in enumerate(per) if not math.isfinite(v)]
    finite = not bad and all(math.isfinite(v) for v in lvals)
    sq = math.fsum(v * v for v in per) if per else 0.0
    norm = math.sqrt(sq) if per and math.isfinite(sq) else (float("inf") if per else None)
    return NormCheck(finite, norm, per, lvals, bad, index)
