"""``nanguard.attach``: watch every step, replay the failing one, apply the policy.

What runs when, in a training step::

    out = model(x)            # root call recorded (args, RNG state)     -- Module.__call__ wrapper
    loss = crit(out, y)       # ops outside modules go on the step's tape
    loss.backward()           # roots recorded; without an optimizer: the check runs after it
    optimizer.step()          # pre-step hook: ONE fused check of loss + gradients
                              #   (a closure -- LBFGS, Lightning -- is checked after it ran)
                              #   (with torch.distributed: one all-reduce of the flag)
                              #   non-finite -> replay the step under the locator -> diagnose
                              #   -> the step controller decides; the backend carries it out
                              #   healthy -> learning-rate back-off and clipping, if switched on
                              # post-step hook: fused check of the weights, history, snapshot
                              # (on CUDA, policy raise: no host read -- the check stays on the
                              #  device, the update is masked there, read one step later)

Every optimizer's step is a step (a GAN's generator and discriminator each count). The
decisions are the framework-free :class:`~nanguard.core.controller.StepController`'s; this module
only turns torch's hooks into its events. The guard never touches the user's module objects
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
from ..core.config import POLICIES
from ..core.diagnosis import Diagnosis, diagnose
from ..core.finding import Finding
from ..core.handle import GuardOptions
from ..core.policy import check_policy
from . import _autograd, _patches
from ._backward_hooks import BackwardHooks
from ._deferred_hooks import DeferredHooks
from ._findings import optimizer_finding
from ._guard_base import param_norm
from ._modules import ModuleStack
from ._optimizer_hooks import OptimizerHooks
from ._recorder import StepRecorder
from ._update_replay import UpdateReplay
from ._watched import ReadCadence, WatchSet
from .snapshot import Snapshotter
from .watch import NormCheck, check_params

__all__ = ["POLICIES", "Guard", "attach"]

_ATTACHED: weakref.WeakKeyDictionary[Any, Guard] = weakref.WeakKeyDictionary()
#: the guard of ``nanguard run`` while it is installed (a script's own attach() adopts it)
_SESSION: list[Guard] = []


class Guard(OptimizerHooks, BackwardHooks, DeferredHooks):
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
        self.snapshots = Snapshotter(every=snapshot_every, directory=snapshot_dir)
        self.replay_enabled = replay
        self.step = 0
        self.backward_calls = 0
        self.step_was_skipped = False
        self.clip_norm: float | None = None  # a clipping threshold the user applies themselves
        self.modules = ModuleStack(model)
        self.recorder = StepRecorder(self.modules)
        self.watch = WatchSet(model, self.modules)
        self.cadence = ReadCadence()
        self.watch.primary = optimizer
        self.update_replay = UpdateReplay()
        self.on_step_end: list[Callable[[], None]] = []  # run after each step (the tracer's counter)
        self._schedulers: weakref.WeakSet[Any] = weakref.WeakSet(schedulers)
        self._scalers: weakref.WeakSet[Any] = weakref.WeakSet([scaler] if scaler is not None else [])
        self._losses: list[torch.Tensor] = []
        self._unscaled: list[torch.Tensor] = []  # the losses a GradScaler scaled, unscaled
        self._pending: NormCheck | None = None
        self._hidden_grads: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        self._saved_lrs: list[Any] = []
        self._handles: list[Any] = []
        self._installed = False
        self._adopted = 0  # attach() calls of a script that adopted this (nanguard run's) guard
        self._backward_steps = 0  # steps counted at backward() since the last optimizer step
        self._carry_loss: float | None = None
        self._deferred: tuple[Finding, Diagnosis] | None = None
        self._buffer_copy: list[torch.Tensor] | None = None
        self._in_opt_step = False
        self._in_closure = False
        self._trialing = False  # a fix is being tried on the failing step (_trial): hooks stand aside
        self._settings_applied = False
        self._n_losses = 0
        self._params_due = True  # the weights are checked once before the first update too
        self._clip_norms: list[torch.Tensor] = []
        self._sinks: list[Any] = []
        self._event_tag: str | None = None
        self._weights_read: tuple[int, float] | None = None
        self._updated = False  # has an update been applied yet (else bad weights came in bad)
        self._last_update_step = -1
        self._weights_ok: bool | None = None  # the last check of the weights (None: not yet)
        self._bad_from_start: set[str] = set()  # weights that were non-finite before any update
        self._defer: bool | None = None
        self._inflight: Any = None
        self._mask: Any = None
        self._closure_step = False
        self.verify = config.verify()
        self.violations: list[dict[str, Any]] = []

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
            self._schedulers.update(_schedulers_made_before(self.optimizer))
        self.modules.on_root_enter = self.recorder.root_enter
        self.recorder.on_quiet = self.hazards_quiet  # a sampled look pauses during an eval loop
        self.recorder.grads_now = lambda: [p.grad for p in self.watch.params() if p.grad is not None]
        self.modules.on_root_exit = self.recorder.root_exit
        self.modules.install(roots_only=True)
        self._handles.append(_autograd.add_backward_listener(self))
        self._handles.append(_autograd.add_optimizer_listener(self._pre_step, self._post_step))
        _patches.register_recorder(self.recorder)
        _patches.register_guard(self)
        self.recorder.resume_tape = True
        self.recorder.tape_on()
        self._installed = True
        return self

    def detach(self) -> None:
        """Stop watching and remove every hook. Safe to call twice.

        With policy ``raise`` the weights left by the last update are checked here (they are
        otherwise checked with the next step's gradients); a non-finite one is added to
        :attr:`findings`. The guard of ``nanguard run``, adopted by the script's ``attach()``,
        stays until the run ends."""
        if self._adopted:
            self._adopted -= 1
            return
        if not self._installed:
            return
        error: BaseException | None = None
        try:
            self.resolve_inflight()  # the deferred watch's last step, read now
        except Exception as e:  # raised after the hooks are removed
            error = e
        try:
            self._detach_hooks()
        finally:
            if error is not None:
                raise error

    def _detach_hooks(self) -> None:
        primary = self.watch.primary
        if self._params_due and primary is not None and self._updated:
            self._params_due = False
            weights, wnames = self.watch.weights(primary)
            pchk = check_params(weights)
            if len(self.history):
                self._note_weights(param_norm(pchk, wnames))
            if not pchk.finite:
                f = optimizer_finding(self, primary, pchk, self._last_update_step, wnames)
                self.findings.append((f, diagnose(f, self.history, self.context())))
        self.recorder.resume_tape = False
        self.recorder.tape_off()
        self.hazards_release()
        _patches.unregister_recorder(self.recorder)
        _patches.unregister_guard(self)
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
        the command line's, and stderr says so."""
        _check_args(model, None, policy)
        if model is not None and self.model is None:
            self.model = self.watch.model = model
        old = self.policy
        changed = {k: kwargs[k] for k in ("max_consecutive_skips", "lr_factor", "max_recoveries",
                                          "recovery_window", "on_unfixable", "snapshot_every") if k in kwargs}
        # the configuration is replaced; the state (counters, back-off, recoveries) is the run's
        self.options = self.options.with_(policy=policy, **changed)
        self.controller.config = self.options.recovery()
        if "snapshot_every" in kwargs:
            self.snapshots.every = int(kwargs["snapshot_every"])
        for s in kwargs.get("schedulers") or ():
            self._schedulers.add(s)
        if kwargs.get("scaler") is not None:
            self._scalers.add(kwargs["scaler"])
        print(f"nanguard: the script's attach(policy={policy!r}) adopts the guard of `nanguard run` "
              f"(policy {old!r}): one guard per run, with the script's policy {policy!r}",
              file=sys.stderr)
        self._adopted += 1
        return self

























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
