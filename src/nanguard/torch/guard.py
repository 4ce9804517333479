"""``nanguard.attach``: watch every step, replay the failing one, apply the policy.

What runs when, in a training step::

    out = model(x)            # root call recorded (args, RNG state)     -- Module.__call__ wrapper
    loss = crit(out, y)       # ops outside modules go on the step's tape
    loss.backward()           # roots recorded; without an optimizer: the check runs after it
    optimizer.step()          # pre-step hook: ONE fused check of loss + gradients
                              #   (a closure -- LBFGS, Lightning -- is checked after it ran)
                              #   -> the step driver (core/step.py): agree across ranks;
                              #   non-finite -> replay the step under the locator -> diagnose
                              #   -> the step controller decides; the actuator carries it out
                              #   healthy -> learning-rate back-off and clipping, if switched on
                              # post-step hook: fused check of the weights, history, snapshot
                              # (on CUDA, policy raise: no host read -- the check stays on the
                              #  device, the update is masked there, read one step later)

The :class:`Guard` is a handle over a few parts with one job each: the watch (what is
watched), the recorder (the step's tape), the replayer (tape -> finding), the actuator (the only
code that changes the user's objects), the hooks (the only holder of the step in progress), and
two observers (the hazard look, the data look). Every optimizer's step is a step (a GAN's
generator and discriminator each count). The guard never touches the user's module objects
(hooks are global), so ``torch.save(model)`` keeps working while it is attached.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ..core import config
from ..core.case import RunContext
from ..core.config import POLICIES
from ..core.diagnosis import diagnose
from ..core.handle import GuardHandle, GuardOptions
from ..core.ops import dtype_max
from ..core.policy import check_policy
from ..core.step import Reading, StepDriver
from . import _autograd, _patches
from ._backend import Actuator
from ._backward_hooks import BackwardHooks
from ._datapeek import DataLook
from ._deferred_hooks import param_norm
from ._hazard_watch import HazardLook
from ._modules import ModuleStack
from ._optimizer_hooks import OptimizerHooks
from ._port import TorchPort, run_context
from ._recorder import Event, StepRecorder
from ._step import TorchStep
from ._watched import WatchSet, plain
from .replay import Replayer
from .snapshot import Snapshotter
from .watch import NormCheck, check_params

__all__ = ["POLICIES", "Guard", "attach"]

_ATTACHED: weakref.WeakKeyDictionary[Any, Guard] = weakref.WeakKeyDictionary()
#: the guard of ``nanguard run`` while it is installed (a script's own attach() adopts it)
_SESSION: list[Guard] = []


class Guard(GuardHandle):
    """The handle :func:`attach` returns. Use it as a context manager or call :meth:`detach`.

    Attributes:
        step: index of the optimizer step in progress (0 for the first; every optimizer's
            step counts, as Lightning's ``global_step``).
        history: per-step loss, gradient norm, weight norm and learning rate.
        findings: ``(Finding, Diagnosis)`` for every non-finite event, in order.
        recoveries: what the policy did, one dict per event (the run log's ``recoveries``).
        step_was_skipped: whether the last optimizer step was skipped (as accelerate).
        controller: the framework-free :class:`~nanguard.core.controller.StepController`.
    """

    def __init__(
        self,
        model: nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        policy: str = "raise",
        replay: bool = True,
        max_consecutive_skips: int = 10,
        lr_factor: float = 0.5,
        max_recoveries: int = 5,
        recovery_window: int = 1000,
        snapshot_every: int = 50,
        snapshot_dir: str | None = None,
        on_unfixable: str = "raise",
        schedulers: Sequence[Any] = (),
        scaler: Any = None,
        history_size: int = 10_000,
    ) -> None:
        _check_args(model, optimizer, policy)
        self.options = GuardOptions(
            policy=policy, replay=replay, max_consecutive_skips=max_consecutive_skips, lr_factor=lr_factor,
            max_recoveries=max_recoveries, recovery_window=recovery_window, snapshot_every=snapshot_every,
            on_unfixable=on_unfixable, history_size=history_size,
        )
        self.model = model
        self.optimizer = optimizer
        self.controller = self.options.controller()
        self.driver = StepDriver(self.controller)
        self.modules = ModuleStack(model)
        self.recorder = StepRecorder(self.modules)
        self.recorder.capture = []  # the first step's batch and targets, for the data's scale
        self.watch = WatchSet(model, self.modules)
        self.watch.primary = optimizer
        self.actuator = Actuator(self.controller, self.watch, Snapshotter(every=snapshot_every, directory=snapshot_dir),
                                 schedulers, scaler)
        self.replayer = Replayer(model, self.modules, self.recorder, self.watch, self.controller, enabled=replay)
        self.hazards = HazardLook(self.controller, self.modules)
        self.data = DataLook(self.controller)
        self.verifier = Verifier(config.verify())
        step = TorchStep()
        self.opt_hooks = OptimizerHooks(self, step)
        self.bwd_hooks = BackwardHooks(self, step)
        self._handles: list[Any] = []
        self._installed = False
        self._adopted = 0  # attach() calls of a script that adopted this (nanguard run's) guard

    # --- the public surface, over the parts ------------------------------------------------------
    @property
    def step(self) -> int:
        return self.driver.step

    @step.setter
    def step(self, value: int) -> None:
        self.driver.step = value

    @property
    def installed(self) -> bool:
        """Whether the guard's hooks are in place (between :meth:`install` and :meth:`detach`)."""
        return self._installed

    @property
    def step_was_skipped(self) -> bool:
        """Whether the last optimizer step's update was kept from the weights (as accelerate)."""
        return self.driver.skipped

    @property
    def on_step_end(self) -> list[Callable[[], None]]:
        """Called after each step's record (the live status line, TensorBoard, a tracer)."""
        return self.driver.on_end

    @property
    def snapshots(self) -> Snapshotter:
        return self.actuator.snapshots

    @property
    def backward_calls(self) -> int:
        return self.bwd_hooks.calls

    @property
    def training_started(self) -> bool:
        """A step ended, or a ``backward()`` ran (in an ``optimizer.step(closure)`` too)."""
        return bool(self.step or self.bwd_hooks.calls or self.bwd_hooks.seen)

    @property
    def clip_norm(self) -> float | None:
        """The clipping threshold the script applies itself (its ``clip_grad_norm_``)."""
        return self.bwd_hooks.script_clip

    @property
    def verify(self) -> bool:
        return self.verifier.enabled

    @property
    def violations(self) -> list[dict[str, Any]]:
        return self.verifier.violations

    def context(self, opt: torch.optim.Optimizer | None = None) -> RunContext:
        """What the diagnosis knows of the run (the optimizer ``opt``, by default the first)."""
        return run_context(self.watch, self.actuator, self.controller, opt, self.clip_norm,
                           self.hazards.recurrences)

    # --- what the hooks share ----------------------------------------------------------------------
    def port(self, params: Sequence[torch.Tensor], opt: torch.optim.Optimizer | None, chk: NormCheck,
             sinks: Sequence[Any], step: int | None = None, events: Sequence[Event] | None = None) -> TorchPort:
        """The step driver's port for the step being checked (``step``/``events``: an earlier
        one, read late by the deferred watch)."""
        return TorchPort(self, params, opt, chk, sinks, self.driver.step if step is None else step, events)

    def end_step(self, chk: NormCheck | None, pchk: NormCheck | None, opt: torch.optim.Optimizer | None,
                 finite: bool | None = None) -> Any:
        """The step ends (healthy or not, also when it raised): its record, the observers."""
        self.hazards.sample_end(self.driver.step)  # a sampled step without an optimizer check
        st = self.opt_hooks.step
        reading = self._reading(chk, pchk, opt, st)

        history = self.controller.history

        def between() -> None:
            if len(history) == 1 or (opt is not None and opt is not self.watch.state.dtype_of):
                self._note_dtype(opt)
            st.reset()
            if not self.data.scale_read:
                self.data.first_step_ended(self.recorder.capture, self.opt_hooks.defer)
                self.recorder.capture = None  # the first step's data only
            self.recorder.new_step()
            if not self.data.frames_looked and history[-1].finite:
                self.data.look_at_frames(self.driver.step, self.opt_hooks.defer)

        rec = self.driver.end(reading, finite, between=between)
        self.hazards.sample_start(self.driver.step, self.opt_hooks.defer)
        return rec

    def _reading(self, g: NormCheck | None, p: NormCheck | None, opt: torch.optim.Optimizer | None,
                 st: TorchStep) -> Reading:
        opt = opt if opt is not None else self.watch.primary
        lr = plain(opt.param_groups[0].get("lr")) if opt is not None and opt.param_groups else None
        lr = lr * self.recovery_state.lr_scale if isinstance(lr, float) else None
        gnorm = g.norm if g is not None else None
        pre_clip = st.pre_clip(g)
        per = g is not None and g.per_tensor and (opt is None or opt is self.watch.primary)
        return Reading(
            finite=(g is None or g.finite) and (p is None or p.finite), loss=st.loss(g),
            grad_norm=pre_clip if pre_clip is not None else gnorm,
            clipped_norm=gnorm if pre_clip is not None else None,
            param_norm=p.norm if p is not None else None, lr=lr,
            opt_type=type(opt).__name__ if opt is not None else None,
            optimizer=self.watch.optimizer_name(opt) if opt is not None else None,
            num_params=self.watch.num_params(),
            layer_values=g.per_tensor if per and g is not None else None,
            layer_names=self.watch.layer_names(g.index) if per and g is not None else None,
        )

    def _note_dtype(self, opt: torch.optim.Optimizer | None) -> None:
        """Once per optimizer: are its weights float16? (the early warnings' headroom rule)"""
        self.watch.state.dtype_of = opt
        params = [p for g in opt.param_groups for p in g["params"]] if opt is not None else self.watch.params()
        if any(p.dtype == torch.float16 for p in params):
            self.controller.early.low_max = dtype_max("float16")

    def note_weights(self, norm: float | None) -> None:
        """The weights the last update left were read: their norm into its history record, and
        kept as the last read (``_watched.weights_wanted``)."""
        rec = self.history[-1]
        rec.param_norm = norm
        self.watch.state.read = (rec.step, norm) if norm is not None else None

    # --- lifecycle ---------------------------------------------------------------------------
    def install(self) -> Guard:
        """Start watching (called by :func:`attach`)."""
        if self._installed:
            return self
        for obj, what in ((self.model, "model"), (self.optimizer, "optimizer")):
            other = _ATTACHED.get(obj) if obj is not None else None
            if other is not None and other._installed:
                raise RuntimeError(
                    f"nanguard is already attached to this {what}. Call guard.detach() on the "
                    "first handle (or leave its `with` block) before attaching again."
                )
        for obj in (self.model, self.optimizer):
            if obj is not None:
                _ATTACHED[obj] = self
        if self.optimizer is not None:
            self.actuator.schedulers.update(_schedulers_made_before(self.optimizer))
        self.modules.on_root_enter = self.recorder.root_enter
        self.recorder.on_quiet = self.hazards.quiet  # a sampled look pauses during an eval loop
        self.recorder.grads_now = lambda: [p.grad for p in self.watch.params() if p.grad is not None]
        self.modules.on_root_exit = self.recorder.root_exit
        self.modules.install(roots_only=True)
        self._handles.append(_autograd.add_backward_listener(self.bwd_hooks))
        self._handles.append(_autograd.add_optimizer_listener(self.opt_hooks.pre, self.opt_hooks.post))
        _patches.register_recorder(self.recorder)
        _patches.register_guard(self.bwd_hooks)
        self.recorder.resume_tape = True
        self.recorder.tape_on()
        self._installed = True
        return self

    def detach(self, force: bool = False) -> None:
        """Stop watching and remove every hook. Safe to call twice.

        With policy ``raise`` the weights left by the last update are checked here (they are
        otherwise checked with the next step's gradients); a non-finite one is added to
        :attr:`findings`. The guard of ``nanguard run``, adopted by the script's ``attach()``,
        stays until the run ends (``force``: the run ended)."""
        if force:
            self._adopted = 0
        if self._adopted:
            self._adopted -= 1
            return
        if not self._installed:
            return
        error: BaseException | None = None
        try:
            self.opt_hooks.deferred.resolve()  # the deferred watch's last step, read now
        except Exception as e:  # raised after the hooks are removed
            error = e
        try:
            self._detach_hooks()
        finally:
            if error is not None:
                raise error

    def resolve_inflight(self) -> None:
        """Read the deferred watch's last step now (the run ends)."""
        self.opt_hooks.deferred.resolve()

    def _detach_hooks(self) -> None:
        primary = self.watch.primary
        ws = self.watch.state
        if ws.due and primary is not None and ws.updated:
            ws.due = False
            weights, wnames = self.watch.weights(primary)
            pchk = check_params(weights)
            if len(self.history):
                self.note_weights(param_norm(pchk, wnames))
            if not pchk.finite:
                f = self.replayer.optimizer_finding(primary, pchk, ws.last_update_step, wnames, None)
                self.findings.append((f, diagnose(f, self.history, self.context())))
        self.recorder.resume_tape = False
        self.recorder.tape_off()
        self.hazards.release(self.driver.step)
        _patches.unregister_recorder(self.recorder)
        _patches.unregister_guard(self.bwd_hooks)
        for h in self._handles:
            h.remove()
        self._handles = []
        self.modules.remove()
        for obj in (self.model, self.optimizer):
            if obj is not None and _ATTACHED.get(obj) is self:
                del _ATTACHED[obj]
        if self in _SESSION:
            _SESSION.remove(self)
        self._installed = False

    def __enter__(self) -> Guard:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def adopt(self, model: nn.Module | None, policy: str, **kwargs: Any) -> Guard:
        """A script's own ``nanguard.attach()`` under ``nanguard run``: one run has exactly one
        guard. The script's call wins (it is the more specific): its policy and options replace
        the command line's — the configuration only: what the run went through so far (counters,
        recoveries, a back-off) stays — and stderr says so."""
        _check_args(model, None, policy)
        if model is not None and self.model is None:
            self.model = self.watch.model = self.replayer.model = model
        old = self.policy
        changed = {k: kwargs[k] for k in ("max_consecutive_skips", "lr_factor", "max_recoveries",
                                          "recovery_window", "on_unfixable", "snapshot_every") if k in kwargs}
        self.options = self.options.with_(policy=policy, **changed)
        self.controller.config = self.options.recovery()
        if "snapshot_every" in kwargs:
            self.snapshots.every = int(kwargs["snapshot_every"])
        for s in kwargs.get("schedulers") or ():
            self.actuator.schedulers.add(s)
        if kwargs.get("scaler") is not None:
            self.actuator.scalers.add(kwargs["scaler"])
        print(f"nanguard: the script's attach(policy={policy!r}) adopts the guard of `nanguard run` "
              f"(policy {old!r}): one guard per run, with the script's policy {policy!r}",
              file=sys.stderr)
        self._adopted += 1
        return self


class Verifier:
    """``NANGUARD_VERIFY=1``: after every step, check the guarantee of ``skip``/``recover`` — no
    weight and no optimizer state holds a non-finite value — and keep every breach."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.violations: list[dict[str, Any]] = []

    def breach(self, step: int, tensors: list[str]) -> None:
        if self.enabled:
            self.violations.append({"step": step, "tensors": tensors[:8]})

    def after_step(self, guard: Guard, opt: torch.optim.Optimizer) -> None:
        if not self.enabled:
            return
        weights, names = guard.watch.weights(opt)
        bad = [n for t, n in zip(weights, names) if not bool(torch.isfinite(t).all())]
        bad = [n for n in bad if n.split(":")[0] not in guard.watch.state.bad_from_start]
        if bad and guard.watch.state.updated:
            self.breach(guard.driver.step - 1, bad)


def _check_args(model: Any, optimizer: Any, policy: str) -> None:
    if model is not None and not isinstance(model, nn.Module):
        raise TypeError(
            f"nanguard.attach(model=...) expects a torch.nn.Module, got {type(model).__name__}. "
            "Pass the model whose training you want to guard: nanguard.attach(model, optimizer)."
        )
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"nanguard.attach(optimizer=...) expects a torch.optim.Optimizer, got "
            f"{type(optimizer).__name__}. Pass the optimizer itself (not a scheduler or a "
            "list), or leave it out to check at every backward()."
        )
    check_policy(policy, "nanguard.attach(policy=...)")


def _schedulers_made_before(opt: torch.optim.Optimizer) -> list[Any]:
    """Schedulers created before attach(): found through the optimizer they refer to."""
    import gc

    found = []
    for ref in gc.get_referrers(opt):
        owners = gc.get_referrers(ref) if isinstance(ref, dict) else [ref]
        found += [o for o in owners
                  if isinstance(o, torch.optim.lr_scheduler.LRScheduler) and o.optimizer is opt]
    return found





def attach(
    model: nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    policy: str = "raise",
    replay: bool = True,
    max_consecutive_skips: int = 10,
    lr_factor: float = 0.5,
    max_recoveries: int = 5,
    recovery_window: int = 1000,
    snapshot_every: int = 50,
    snapshot_dir: str | None = None,
    on_unfixable: str = "raise",
    schedulers: Sequence[Any] = (),
    scaler: Any = None,
) -> Guard:
    """Guard an ordinary training loop; returns the :class:`Guard` handle.

    Nothing in the loop changes::

        guard = nanguard.attach(model, optimizer)           # or: with nanguard.attach(...) as g:
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()      # <- NonFiniteError here, before a bad update is applied

    At every ``optimizer.step()`` (or, without an optimizer, after every ``backward()``) one
    fused check looks at the loss and all gradients. When it sees a NaN/Inf, the step is replayed
    under the locator to find the op that made it, the cause is diagnosed from the run's history,
    and ``policy`` decides:

    * ``"raise"`` (default): raise :class:`~nanguard.NonFiniteError`;
    * ``"skip"``: do not apply that update; give up after ``max_consecutive_skips`` in a row;
    * ``"recover"``: drop a poisoned batch; roll back to the last snapshot (taken every
      ``snapshot_every`` steps, in CPU memory, or also in ``snapshot_dir``) and multiply the
      learning rate by ``lr_factor`` and/or clip gradients at a threshold from the healthy
      history; stop with the diagnosis where no blind fix exists (or skip, with
      ``on_unfixable="skip"``); give up after ``max_recoveries`` rollbacks in
      ``recovery_window`` steps.

    LR schedulers and a ``torch.amp.GradScaler`` made after ``attach`` are found automatically
    (their state is part of a snapshot); pass earlier ones with ``schedulers=`` / ``scaler=``.

    Under ``nanguard run`` the run already has a guard: this call adopts it (one guard per model
    and optimizer), with this call's policy and options, and says so on stderr.
    """
    options = dict(
        max_consecutive_skips=max_consecutive_skips, lr_factor=lr_factor,
        max_recoveries=max_recoveries, recovery_window=recovery_window,
        snapshot_every=snapshot_every, on_unfixable=on_unfixable,
        schedulers=schedulers, scaler=scaler,
    )
    session = _SESSION[-1] if _SESSION else None
    if session is not None and session._installed:
        return session.adopt(model, policy, **options)
    return Guard(
        model, optimizer, policy=policy, replay=replay, snapshot_dir=snapshot_dir,
        max_consecutive_skips=max_consecutive_skips, lr_factor=lr_factor,
        max_recoveries=max_recoveries, recovery_window=recovery_window,
        snapshot_every=snapshot_every, on_unfixable=on_unfixable, schedulers=schedulers, scaler=scaler,
    ).install()
