"""The state a torch guard keeps through a step, and the bookkeeping every hook shares: one
history record per step, the end of a step, a failure handed to the step controller.

:class:`GuardBase` declares the guard's attributes (set by :class:`~nanguard.torch.guard.Guard`)
for the two hook mixins — :class:`~nanguard.torch._backward_hooks.BackwardHooks` (around each
``backward()``, a loss scaler's step, ``clip_grad_norm_``) and
:class:`~nanguard.torch._optimizer_hooks.OptimizerHooks` (around each ``optimizer.step()``).
"""

from __future__ import annotations

import logging
import math
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ..core.controller import StepController
from ..core.diagnosis import Diagnosis, RunContext, diagnose
from ..core.finding import Finding
from ..core.handle import GuardHandle
from ..core.history import History, StepRecord
from ..core.ops import ADAPTIVE_OPTIMIZERS, update_norm_estimate
from . import _dist
from ._backend import TorchBackend
from ._datapeek import DataLook
from ._findings import carried_diagnosis, locate_step
from ._hazard_watch import HazardSampling
from ._modules import ModuleStack
from ._recorder import StepRecorder
from ._update_replay import UpdateReplay
from ._watched import HYPER, ReadCadence, WatchSet, opt_params, plain
from .snapshot import SCHEDULERS, Snapshotter
from .watch import NormCheck

__all__ = ["GuardBase"]

log = logging.getLogger("nanguard")


class GuardBase(DataLook, HazardSampling, GuardHandle):
    """What a torch guard knows of the run and of the step in progress."""

    model: nn.Module | None
    optimizer: torch.optim.Optimizer | None
    controller: StepController
    snapshots: Snapshotter
    replay_enabled: bool
    step: int
    backward_calls: int
    step_was_skipped: bool
    clip_norm: float | None
    modules: ModuleStack
    recorder: StepRecorder
    watch: WatchSet
    cadence: ReadCadence  # how often quiet steps read the weights and the state
    update_replay: UpdateReplay
    on_step_end: list[Callable[[], None]]
    verify: bool
    violations: list[dict[str, Any]]
    _schedulers: weakref.WeakSet[Any]
    _scalers: weakref.WeakSet[Any]
    _losses: list[torch.Tensor]
    _unscaled: list[torch.Tensor]
    _pending: NormCheck | None
    _hidden_grads: list[tuple[torch.Tensor, torch.Tensor | None]]
    _saved_lrs: list[Any]
    _backward_steps: int
    _carry_loss: float | None
    _deferred: tuple[Finding, Diagnosis] | None
    _buffer_copy: list[torch.Tensor] | None
    _in_opt_step: bool
    _in_closure: bool
    _trialing: bool
    _settings_applied: bool
    _n_losses: int
    _params_due: bool
    _clip_norms: list[torch.Tensor]
    _sinks: list[Any]
    _event_tag: str | None
    _updated: bool
    _last_update_step: int
    _weights_ok: bool | None
    _weights_read: tuple[int, float] | None  # (record's step, weight norm) of the last read
    _bad_from_start: set[str]
    _dtype_of: Any = None  # the optimizer whose weights' dtype was last looked at
    _defer: bool | None  # the deferred watch (no host sync per step; ``_deferred``), decided once
    _inflight: Any
    _mask: Any
    _closure_step: bool

    #: the deferred watch (GPU) checks the optimizer state every this many steps (the
    #: synchronous one every ``2 · ReadCadence.every``, the weights when
    #: ``_watched.weights_wanted``): each check reads the tensors once
    STATE_CHECK_EVERY = 16

    def _loss_bad(self) -> bool:
        """Is the step's loss itself not finite (:class:`BackwardHooks`)?"""
        raise NotImplementedError

    def _check_deferred(self, opt: torch.optim.Optimizer, params: list[torch.Tensor]) -> None:
        """The check left on the device (:class:`~nanguard.torch._deferred_hooks.DeferredHooks`)."""
        raise NotImplementedError

    def _deferred_after_step(self) -> None:
        raise NotImplementedError

    def _adopt_primary(self, opt: torch.optim.Optimizer) -> None:
        """Make ``opt`` the step marker (:class:`~nanguard.torch._optimizer_hooks.OptimizerHooks`)."""
        raise NotImplementedError

    def _schedulers_of(self, opt: torch.optim.Optimizer | None) -> list[Any]:
        found = list(self._schedulers) + [s for s in SCHEDULERS if s not in self._schedulers]
        return [s for s in found if opt is not None and getattr(s, "optimizer", None) is opt]

    def _scalers_all(self) -> list[Any]:
        """The loss scalers of this guard's run: passed to ``attach(scaler=...)``, or seen scaling
        a loss or stepping while attached."""
        return list(self._scalers)

    def context(self, opt: torch.optim.Optimizer | None = None) -> RunContext:
        """What the diagnosis knows of the run: the hyper-parameters of ``opt`` (the optimizer
        whose step failed; by default the first one stepped), its scheduler, any clipping."""
        primary = opt is None or opt is self.watch.primary
        opt = self.watch.primary if opt is None else opt
        hyper: dict[str, Any] = {}
        if opt is not None and opt.param_groups:
            g = opt.param_groups[0]
            hyper = {k: plain(g[k]) for k in HYPER if k in g}
            if "lr" in hyper and isinstance(hyper["lr"], float):
                hyper["lr"] *= self.recovery_state.lr_scale
        params = self.watch.params() if primary else opt_params(opt)
        scheds = self._schedulers_of(opt)
        return RunContext(
            framework="torch",
            optimizer=type(opt).__name__ if opt is not None else None,
            hyper=hyper,
            clip_norm=self.clip_norm if self.clip_norm is not None else self.recovery_state.clip_norm,
            num_params=sum(p.numel() for p in params) or None,
            scheduler=type(scheds[0]).__name__ if scheds else None,
            lr_scale=self.recovery_state.lr_scale,
            recurrences=dict(self.hz_recurrences or {}),
        )

    def _history_for(self, opt: torch.optim.Optimizer | None) -> History:
        return self.history.of(self.watch.optimizer_name(opt) if opt is not None else None)

    def _give_back(self) -> None:
        """After the optimizer step: the learning rates and the hidden gradients, as they were."""
        if self._saved_lrs and self.watch.primary is not None:
            for group, lr in zip(self.watch.primary.param_groups, self._saved_lrs):
                group["lr"] = lr  # the back-off is a factor applied at each step, never stored
        self._saved_lrs = []
        for p, g in self._hidden_grads:  # give the user their gradients back
            p.grad = g
        self._hidden_grads = []

    def _abort_step(self, opt: torch.optim.Optimizer | None) -> None:
        """The step raised (a finding under ``raise``, a give-up, or the script's own error in a
        closure): end it cleanly, so that a script that catches the error and goes on starts its
        next step with nothing stale (losses, hidden gradients, a paused recorder)."""
        self._in_opt_step = False
        self._in_closure = False
        self.recorder.paused = max(0, self.recorder.paused - 1)
        self._give_back()
        self._record(self._pending, None, opt, finite=False)
        self._end_step()
        if not self.recorder.paused and not self.modules.depth:
            self.recorder.tape_on()

    def _verify(self, opt: torch.optim.Optimizer) -> None:
        """``NANGUARD_VERIFY=1``: after every step, check the guarantee of ``skip``/``recover`` —
        no weight and no optimizer state holds a non-finite value — and log any breach."""
        weights, names = self.watch.weights(opt)
        bad = [n for t, n in zip(weights, names) if not bool(torch.isfinite(t).all())]
        bad = [n for n in bad if n.split(":")[0] not in self._bad_from_start]
        if bad and self._updated:
            self.violations.append({"step": self.step - 1, "tensors": bad[:8]})

    def _note_dtype(self, opt: torch.optim.Optimizer | None) -> None:
        """Once per optimizer: are its weights float16? (the early warnings' headroom rule)"""
        self._dtype_of = opt
        params = [p for g in opt.param_groups for p in g["params"]] if opt is not None else self.watch.params()
        if any(p.dtype == torch.float16 for p in params):
            self.controller.early.low_max = 65504.0

    def _record(self, g: NormCheck | None, p: NormCheck | None, opt: torch.optim.Optimizer | None,
                finite: bool | None = None) -> None:
        opt = opt if opt is not None else self.watch.primary
        lr = plain(opt.param_groups[0].get("lr")) if opt is not None and opt.param_groups else None
        lr = lr * self.recovery_state.lr_scale if isinstance(lr, float) else None
        n_loss = self._n_losses if g is not None else 0
        loss = math.fsum(g.losses[:n_loss]) if g is not None and n_loss else self._carry_loss
        self._carry_loss = None
        gnorm = g.norm if g is not None else None
        # the script's clip_grad_norm_ returned the total norm from before it clipped: that is
        # the evidence (the update itself used the clipped gradients: its size is from gnorm)
        pre = [v for v in (g.losses[n_loss:] if g is not None else []) if v == v]
        pre_clip = max(pre) if pre else None
        if finite is None:
            finite = (g is None or g.finite) and (p is None or p.finite)
        rec = StepRecord(
            step=self.step,
            loss=loss,
            update_norm=update_norm_estimate(type(opt).__name__ if opt is not None else None, lr, gnorm,
                                             self.watch.num_params()),
            grad_norm=pre_clip if pre_clip is not None else gnorm,
            clipped_norm=gnorm if pre_clip is not None else None,
            param_norm=p.norm if p is not None else None,
            lr=lr,
            finite=finite,
            skipped=self.step_was_skipped,
            event=self._event_tag or (None if finite else "nonfinite"),
            optimizer=self.watch.optimizer_name(opt) if opt is not None else None,
        )
        self._event_tag = None
        if g is not None and g.per_tensor and (opt is None or opt is self.watch.primary):
            rec.layer_values = g.per_tensor
            rec.layer_names = self.watch.layer_names(g.index)
        self.history.append(rec)
        if rec.step == 0 or (opt is not None and opt is not self._dtype_of):
            self._note_dtype(opt)

    def _note_weights(self, norm: float | None) -> None:
        """The weights the last update left were read: their norm into its history record, and
        kept as the last read (``_watched.weights_wanted``)."""
        rec = self.history[-1]
        rec.param_norm = norm
        self._weights_read = (rec.step, norm) if norm is not None else None

    def _end_step(self) -> None:
        self.hazards_sample_end()  # a sampled step without an optimizer check (manual SGD)
        self.step += 1
        self._losses = []
        self._unscaled = []
        self._clip_norms = []
        self._sinks = []
        self._pending = None
        self.recorder.new_step()
        if not self._frames_looked and len(self.history) and self.history[-1].finite:
            self.look_at_frames()
        self.controller.step_ended()
        for fn in self.on_step_end:
            fn()
        self.hazards_sample_start()

    def _failure(self, chk: NormCheck, params: Sequence[torch.Tensor], bad_ranks: Sequence[int],
                 opt: torch.optim.Optimizer | None, note: str | None = None) -> None:
        finding: Finding | None = None
        diag: Diagnosis | None = None
        if not chk.finite or not bad_ranks:
            finding = locate_step(self, chk, params)
            if note:
                finding.details["note"] = note
            if not self.history.healthy():
                finding.details.setdefault("first_step", True)
            diag = diagnose(finding, self._history_for(opt), self.context(opt))
            if finding.details.get("origin") == "carried":
                diag = carried_diagnosis(finding, self.findings[0] if self.findings else None, diag)
        if _dist.active():
            finding, diag = _dist.share(finding, diag, bad_ranks)
        assert finding is not None and diag is not None
        self._act(finding, diag, params, opt)

    def _act(self, finding: Finding, diag: Diagnosis, params: Sequence[torch.Tensor],
             opt: torch.optim.Optimizer | None, rollback_weights: bool = False,
             after_update: bool = False) -> None:
        """Have the step controller decide; :class:`TorchBackend` carries it out."""
        eps = None
        if opt is not None and opt.param_groups:
            e = opt.param_groups[0].get("eps")
            eps = float(e) if isinstance(e, (int, float)) else None
        action = self.controller.act(
            finding, diag, TorchBackend(self, params, opt), step=self.step, eps=eps,
            after_update=after_update, rollback_weights=rollback_weights, script_clip=self.clip_norm,
            adaptive=opt is not None and type(opt).__name__ in ADAPTIVE_OPTIMIZERS,
        )
        self._event_tag = action.kind
        self.step_was_skipped = True


def param_norm(chk: NormCheck, names: Sequence[str]) -> float | None:
    """The weights' 2-norm from a check over weights and optimizer state."""
    vals = [v for v, n in zip(chk.per_tensor, names) if ":" not in n]
    if not vals:
        return chk.norm
    sq = math.fsum(v * v for v in vals)
    return math.sqrt(sq) if math.isfinite(sq) else float("inf")


def scale_of(scaler: Any) -> float:
    """A loss scaler's current scale (NaN when it cannot be read)."""
    try:
        return float(scaler.get_scale())
    except Exception:  # a scaler nanguard cannot read: its scale is unknown
        log.debug("nanguard: cannot read the scale of %s", type(scaler).__name__, exc_info=True)
        return float("nan")
