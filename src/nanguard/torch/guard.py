"""``nanguard.attach``: watch every step, replay the failing one, apply the policy.

What runs when, in a training step::

    out = model(x)            # root call recorded (args, RNG state)     -- global module hooks
    loss = crit(out, y)       # ops outside modules go on the step's tape
    loss.backward()           # roots recorded; without an optimizer: the check runs after it
    optimizer.step()          # pre-step hook: ONE fused check of loss + gradients
                              #   (with torch.distributed: one all-reduce of the flag)
                              #   non-finite -> replay the step under the locator -> diagnose
                              #   -> policy: raise / skip / drop the batch / roll back
                              #   healthy -> learning-rate back-off and clipping, if switched on
                              # post-step hook: fused check of the weights, history, snapshot

The guard never touches the user's module objects (hooks are global), so ``torch.save(model)``
keeps working while it is attached.
"""

from __future__ import annotations

import gc
import math
import os
import time
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..core.config import POLICIES
from ..core.diagnosis import Diagnosis, RunContext, diagnose
from ..core.errors import GiveUpError, NonFiniteError
from ..core.finding import Finding
from ..core.history import History, StepRecord
from ..core.ops import update_norm_estimate
from ..core.policy import Recovery, RecoveryCounters, loss_scale_gave_up
from ..core.source import user_frame
from . import _autograd, _dist, _patches
from ._modules import ModuleStack
from ._modules import unwrap as _unwrap
from ._recorder import StepRecorder
from ._stats import all_finite, checkable, counts, finding_for
from .locator import Locator, graph_leaves
from .replay import replay
from .snapshot import SCALERS, SCHEDULERS, Snapshotter, floating_buffers, module_buffers
from .watch import NormCheck, check, check_params

__all__ = ["POLICIES", "Guard", "attach"]

_ATTACHED: weakref.WeakKeyDictionary[Any, Guard] = weakref.WeakKeyDictionary()
_HYPER = ("lr", "eps", "momentum", "weight_decay", "betas", "alpha", "nesterov", "dampening")


class Guard(RecoveryCounters, _autograd.BackwardListener):
    """The handle :func:`attach` returns. Use it as a context manager or call :meth:`detach`.

    Attributes:
        step: index of the optimizer step in progress (0 for the first).
        history: per-step loss, gradient norm, weight norm and learning rate.
        findings: ``(Finding, Diagnosis)`` for every non-finite event, in order.
        recoveries: what the policy did, one dict per event (the run log's ``recoveries``).
        step_was_skipped: whether the last optimizer step was skipped (as accelerate).
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
        if policy not in POLICIES:
            raise ValueError(
                f"nanguard.attach(policy={policy!r}): valid policies are {', '.join(POLICIES)}."
            )
        self.model = model
        self.optimizer = optimizer
        self.policy = policy
        self.recovery = Recovery(
            policy=policy,
            max_consecutive_skips=max_consecutive_skips,
            lr_factor=lr_factor,
            max_recoveries=max_recoveries,
            window=recovery_window,
            on_unfixable=on_unfixable,
        )
        self.snapshots = Snapshotter(every=snapshot_every, directory=snapshot_dir)
        self.replay_enabled = replay
        self.history = History(maxlen=history_size)
        self.findings: list[tuple[Finding, Diagnosis]] = []
        self.step = 0
        self.backward_calls = 0
        self.step_was_skipped = False
        self.clip_norm: float | None = None  # a clipping threshold the user applies themselves
        self.modules = ModuleStack(model)
        self.recorder = StepRecorder(self.modules)
        self.on_step_end: list[Any] = []  # callables run after each step (the tracer's counter)
        self._schedulers: weakref.WeakSet[Any] = weakref.WeakSet(schedulers)
        self._scalers: weakref.WeakSet[Any] = weakref.WeakSet([scaler] if scaler is not None else [])
        self._primary: torch.optim.Optimizer | None = optimizer
        self._losses: list[torch.Tensor] = []
        self._leaves: list[torch.Tensor] | None = None
        self._names: dict[int, str] = {}
        self._names_key: tuple[Any, ...] | None = None
        self._pending: NormCheck | None = None
        self._hidden_grads: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        self._saved_lrs: list[Any] = []
        self._handles: list[Any] = []
        self._installed = False
        self._ended_by_backward = False
        self._backward_steps = 0  # steps counted at backward() since the last optimizer step
        self._carry_loss: float | None = None
        self._deferred: tuple[Finding, Diagnosis] | None = None
        self._buffer_copy: list[torch.Tensor] | None = None
        self._scaler_skips = 0
        self._in_opt_step = False
        self._n_losses = 0
        self._params_due = True  # the weights are checked once before the first update too
        self._clip_norms: list[torch.Tensor] = []
        self._sinks: list[Any] = []
        self._updated = False  # has an update been applied yet (else bad weights came in bad)
        self._weights_ok: bool | None = None  # the last check of the weights (None: not yet)
        self._bad_from_start: set[str] = set()  # weights that were non-finite before any update
        self.verify = os.environ.get("NANGUARD_VERIFY", "") == "1"
        self.violations: list[dict[str, Any]] = []
        self._pre_copy: tuple[int, list[torch.Tensor], list[Any], dict[Any, Any]] | None = None
        self._copy_times: list[float] = []
        self._step_times: list[float] = []
        self._last_pre: float | None = None

    # --- lifecycle ---------------------------------------------------------------------------
    def install(self) -> Guard:
        """Start watching (called by :func:`attach`)."""
        if self._installed:
            return self
        for obj, what in ((self.model, "model"), (self.optimizer, "optimizer")):
            if obj is not None:
                other = _ATTACHED.get(obj)
                if other is not None and other._installed:
                    raise RuntimeError(
                        f"nanguard is already attached to this {what}. Call guard.detach() on the "
                        "first handle (or leave its `with` block) before attaching again."
                    )
        for obj in (self.model, self.optimizer):
            if obj is not None:
                _ATTACHED[obj] = self
        if self.optimizer is not None:
            self._discover_existing(self.optimizer)
        self.modules.on_root_enter = self.recorder.root_enter
        self.modules.on_root_exit = self.recorder.root_exit
        self.modules.install()
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
        :attr:`findings`.
        """
        if not self._installed:
            return
        if self._params_due and self._primary is not None and self._updated:
            self._params_due = False
            weights, wnames = self._weights(self._primary)
            pchk = check_params(weights)
            if len(self.history):
                self.history[-1].param_norm = _param_norm(pchk, wnames)
            if not pchk.finite:
                self.findings.append(self._optimizer_finding(self._primary, pchk, self.step - 1, wnames))
        self.recorder.resume_tape = False
        self.recorder.tape_off()
        _patches.unregister_recorder(self.recorder)
        _patches.unregister_guard(self)
        for h in self._handles:
            h.remove()
        self._handles = []
        self.modules.remove()
        for obj in (self.model, self.optimizer):
            if obj is not None and _ATTACHED.get(obj) is self:
                del _ATTACHED[obj]
        self._installed = False

    def __enter__(self) -> Guard:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def _discover_existing(self, opt: torch.optim.Optimizer) -> None:
        """Schedulers and GradScalers created before attach(): found through the optimizer."""
        for ref in gc.get_referrers(opt):
            owners = gc.get_referrers(ref) if isinstance(ref, dict) else [ref]
            for o in owners:
                if isinstance(o, torch.optim.lr_scheduler.LRScheduler) and o.optimizer is opt:
                    self._schedulers.add(o)

    # --- what is watched --------------------------------------------------------------------------
    def _roots(self) -> list[nn.Module]:
        roots: list[nn.Module] = [self.model] if self.model is not None else []
        roots += [m for m in self.modules.roots_seen if m is not self.model]
        return roots

    def _param_names(self) -> dict[int, str]:
        """``id(parameter) -> name``, recomputed only when the set of models or the optimizer's
        parameter count changes (it is read at every step)."""
        roots = self._roots()
        nparams = sum(len(g["params"]) for g in self._primary.param_groups) if self._primary else 0
        key = (tuple(id(r) for r in roots), nparams)
        if key != self._names_key:
            names: dict[int, str] = {}
            for r in roots:
                base = _unwrap(r)
                for n, p in base.named_parameters():
                    names.setdefault(id(p), n)
            self._names = names
            self._names_key = key
        return self._names

    def _watched_params(self) -> list[torch.Tensor]:
        if self._primary is not None:
            return self._opt_params(self._primary)
        return list(self._leaves or [])

    def _schedulers_of(self, opt: torch.optim.Optimizer | None) -> list[Any]:
        found = list(self._schedulers) + [s for s in SCHEDULERS if s not in self._schedulers]
        return [s for s in found if opt is not None and getattr(s, "optimizer", None) is opt]

    def _scalers_all(self) -> list[Any]:
        return list(self._scalers) + [s for s in SCALERS if s not in self._scalers]

    def context(self, opt: torch.optim.Optimizer | None = None) -> RunContext:
        """What the diagnosis knows of the run: the hyper-parameters of ``opt`` (the optimizer
        whose step failed; by default the first one stepped), its scheduler, any clipping."""
        primary = opt is None or opt is self._primary
        opt = self._primary if opt is None else opt
        hyper: dict[str, Any] = {}
        if opt is not None and opt.param_groups:
            g = opt.param_groups[0]
            hyper = {k: _plain(g[k]) for k in _HYPER if k in g}
            if "lr" in hyper and isinstance(hyper["lr"], float):
                hyper["lr"] *= self.recovery.lr_scale
        params = self._watched_params() if primary else self._opt_params(opt)
        n = sum(p.numel() for p in params) or None
        scheds = self._schedulers_of(opt)
        return RunContext(
            framework="torch",
            optimizer=type(opt).__name__ if opt is not None else None,
            hyper=hyper,
            clip_norm=self.clip_norm if self.clip_norm is not None else self.recovery.clip_norm,
            num_params=n,
            scheduler=type(scheds[0]).__name__ if scheds else None,
        )

    #: the copy kept to replay an update is made while it costs at most this share of a step (the
    #: measured copy; its real cost, with allocation and cache traffic, is up to twice that)
    REPLAY_COPY_BUDGET = 0.02

    #: with policy "raise", the optimizer state is checked every this many steps (the weights
    #: every step): each check reads the tensors once, and on a memory-bound step that shows
    STATE_CHECK_EVERY = 16

    def _weights(
        self, opt: torch.optim.Optimizer, with_state: bool = True
    ) -> tuple[list[torch.Tensor], list[str]]:
        """The weights and (``with_state``) the optimizer's state tensors
        (``fc.weight:exp_avg_sq``): what an update writes, and what must stay finite after it."""
        names = self._param_names()
        ts: list[torch.Tensor] = []
        ns: list[str] = []
        for p in self._opt_params(opt):
            name = names.get(id(p), "?")
            ts.append(p)
            ns.append(name)
            if not with_state:
                continue
            for k, v in opt.state.get(p, {}).items():
                if isinstance(v, torch.Tensor) and v.numel() > 1 and checkable(v):
                    ts.append(v)
                    ns.append(f"{name}:{k}")
        return ts, ns

    @staticmethod
    def _opt_params(opt: torch.optim.Optimizer | None) -> list[torch.Tensor]:
        if opt is None:
            return []
        return [p for g in opt.param_groups for p in g["params"]]

    # --- backward ------------------------------------------------------------------------------
    def before(
        self,
        kind: str,
        roots: Sequence[torch.Tensor],
        grads: Sequence[torch.Tensor | None],
        inputs: Sequence[torch.Tensor] | None,
    ) -> None:
        if self._in_opt_step:
            return  # a closure's backward (LBFGS): the optimizer step is the unit
        self.recorder.backward(kind, roots, grads, inputs)
        self.recorder.paused += 1
        self.recorder.tape_off()
        for r in roots:
            if isinstance(r, torch.Tensor):
                self._losses.append(r.detach())
        if self._primary is None and self._leaves is None and kind == "backward":
            self._leaves = list(inputs) if inputs else graph_leaves(roots)

    def after(
        self,
        kind: str,
        roots: Sequence[torch.Tensor],
        inputs: Sequence[torch.Tensor] | None,
        result: Any,
    ) -> None:
        if self._in_opt_step:
            return
        try:
            if kind == "backward":
                self.backward_calls += 1
                if self._primary is None:
                    self._after_backward_step()
        finally:
            # the check's own ops are not part of the user's step: record again only after it
            self.recorder.paused -= 1
            if not self.recorder.paused and not self.modules.depth:
                self.recorder.tape_on()

    def _after_backward_step(self) -> None:
        """No optimizer (yet): ``backward()`` is the step marker. Check the gradients — and the
        weights, whose growth is the evidence for a learning rate that is too high — now."""
        leaves = self._leaves or []
        self._n_losses = len(self._losses)
        chk, pchk = check([p.grad for p in leaves], self._losses, leaves)
        if self.verify and pchk is not None and not pchk.finite and self._backward_steps:
            self.violations.append({"step": self.step - 1, "tensors": ["weights (no optimizer)"]})
        ok, bad_ranks = _dist.agree(chk.finite, leaves)
        if ok:
            self.recovery.healthy_step()
            self._maybe_snapshot(before_update=True)
            self._apply_to_grads(leaves, None, chk.norm)
        else:
            self._failure(chk, leaves, bad_ranks, opt=None)
        self._record(chk, pchk)
        self._end_step()
        self._ended_by_backward = True
        self._backward_steps += 1

    # --- optimizer -----------------------------------------------------------------------------
    def _pre_step(
        self, opt: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        if self.optimizer is not None and opt is not self.optimizer:
            return
        self.recorder.paused += 1
        self.recorder.tape_off()
        self._in_opt_step = True
        if self._primary is None:
            self._primary = opt
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
        self._ended_by_backward = False
        self._backward_steps = 0
        self._leaves = None
        self.step_was_skipped = False
        params = self._opt_params(opt)
        if not any(p.grad is not None for p in params) and not self._losses:
            return  # a closure-based optimizer (LBFGS) computes its gradients inside step()
        # with policy "raise" the weights the previous update left are checked here, in the same
        # fused check as the gradients: one host synchronisation per step
        self._n_losses = len(self._losses)
        due = self._params_due and opt is self._primary
        # the state too: periodically, and whenever the last update's gradients were large enough
        # for their squares to overflow float32 in it (Adam's exp_avg_sq, Adagrad's sum)
        last_gn = self.history[-1].grad_norm if len(self.history) else None
        with_state = self.step % self.STATE_CHECK_EVERY == 0 or (
            last_gn is not None and not last_gn < 1e17
        )
        weights, wnames = self._weights(opt, with_state) if due else ([], [])
        chk, pchk = check([p.grad for p in params], [*self._losses, *self._clip_norms], weights)
        opt_failure: tuple[Finding, Diagnosis] | None = None
        if pchk is not None:
            self._params_due = False
            self._weights_ok = pchk.finite
            if len(self.history) and self._updated:
                self.history[-1].param_norm = _param_norm(pchk, wnames)
            if not pchk.finite:
                opt_failure = (
                    self._optimizer_finding(opt, pchk, self.step - 1, wnames)
                    if self._updated
                    else self._parameter_finding(pchk, wnames)
                )
        if (
            not chk.finite
            and not chk.bad
            and self._scalers_all()
            and all(not math.isnan(v) for v in chk.losses)
        ):
            # a GradScaler scaled the loss until it overflowed, but the unscaled gradients it
            # passed on are finite: the scaler's business, not a failure (a NaN loss still is)
            chk.finite = True
        self._pending = chk
        if opt_failure is not None and self._deferred is None:
            self._deferred = opt_failure
        ok, bad_ranks = _dist.agree(chk.finite and self._deferred is None, params)
        if ok:
            if self.policy == "raise" or opt is not self._primary:
                self.recovery.healthy_step()
            if opt is self._primary:
                self._maybe_snapshot(before_update=True)
            self._apply_to_grads(params, opt, chk.norm)
            if opt is self._primary:
                self._keep_for_replay(opt, params)
            return
        if self._deferred is not None:
            # the previous step's update made the weights non-finite (found after it): act on it
            # now that every rank agrees
            finding, diag = self._deferred
            self._deferred = None
            if _dist.active():
                finding, diag = _dist.share(finding, diag, bad_ranks)
            self._act(finding, diag, params, opt, rollback_weights=True)
            return
        self._failure(chk, params, bad_ranks, opt=opt)

    def _post_step(
        self, opt: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        if self.optimizer is not None and opt is not self.optimizer:
            return
        self._in_opt_step = False
        self.recorder.paused = max(0, self.recorder.paused - 1)
        if self._saved_lrs:
            for group, lr in zip(opt.param_groups, self._saved_lrs):
                group["lr"] = lr  # the back-off is a factor applied at each step, never stored
            self._saved_lrs = []
        if self._hidden_grads:
            for p, g in self._hidden_grads:  # give the user their gradients back
                p.grad = g
            self._hidden_grads = []
        if opt is self._primary and not self.step_was_skipped:
            self._updated = True
        if opt is self._primary and self.policy == "raise":
            self._params_due = True  # checked with the next step's gradients
            self._record(self._pending, None)
            self._end_step()
        elif opt is self._primary:
            params = self._opt_params(opt)
            weights, wnames = self._weights(opt)
            pchk = check_params(weights)
            pchk.norm = _param_norm(pchk, wnames)
            was_ok, self._weights_ok = self._weights_ok, pchk.finite
            if not pchk.finite and not self.step_was_skipped:
                if was_ok is False:
                    # the weights were non-finite before this update: not the optimizer's doing
                    finding, diag = self._parameter_finding(pchk, wnames)
                else:
                    finding, diag = self._optimizer_finding(opt, pchk, self.step, wnames)
                if _dist.active():
                    self._deferred = (finding, diag)  # every rank must agree: act at the next check
                else:
                    self._act(finding, diag, params, opt, rollback_weights=was_ok is not False,
                              after_update=True)
            elif pchk.finite:
                if not self.step_was_skipped:
                    self.recovery.healthy_step()  # gradients and the update both checked
                self._maybe_snapshot(before_update=False)
            self._record(self._pending, pchk)
            self._end_step()
        else:
            self.recorder.new_step()
        if self.verify and opt is self._primary and self.policy != "raise":
            self._verify(opt)
        if not self.recorder.paused and not self.modules.depth:
            self.recorder.tape_on()

    def _verify(self, opt: torch.optim.Optimizer) -> None:
        """``NANGUARD_VERIFY=1``: after every step, check the guarantee of ``skip``/``recover`` —
        no weight and no optimizer state holds a non-finite value — and log any breach."""
        weights, names = self._weights(opt)
        bad = [n for t, n in zip(weights, names) if not bool(torch.isfinite(t).all())]
        bad = [n for n in bad if n.split(":")[0] not in self._bad_from_start]
        if bad and self._updated:
            self.violations.append({"step": self.step - 1, "tensors": bad[:8]})

    def clip_called(self, total_norm: Any, max_norm: float) -> None:
        """After ``torch.nn.utils.clip_grad_norm_``: when the total norm overflowed, every gradient
        was scaled by 0 and the returned inf is the only trace — it joins the step's check."""
        if isinstance(max_norm, (int, float)) and math.isfinite(max_norm):
            self.clip_norm = float(max_norm)
        if isinstance(total_norm, torch.Tensor) and checkable(total_norm):
            self._clip_norms.append(total_norm.detach())
            ref = self.recorder._made.get(total_norm)
            if ref is not None:
                self._sinks.append((ref, "total gradient norm that clip_grad_norm_ returned"))

    def scaler_step(self, scaler: Any, optimizer: torch.optim.Optimizer, stepped: bool) -> None:
        """Called after ``GradScaler.step``: its own skipped steps are not failures, unless the
        loss itself is NaN or it keeps skipping (the scale cannot fix the values)."""
        self._scalers.add(scaler)
        if stepped:
            self._scaler_skips = 0
            return
        self._scaler_skips += 1
        nan_loss = any(bool(torch.isnan(x).any()) for x in self._losses)
        scale = _scale(scaler)
        if not nan_loss and not loss_scale_gave_up(
            scale if math.isfinite(scale) else None, self._scaler_skips, self.recovery.max_consecutive_skips
        ):
            # the scaler's own business: its loss scale overflowed, it lowers the scale
            self.step_was_skipped = True
            self._event_tag = "scaler-skip"
            self._record(None, None)
            self._end_step()
            return
        params = self._opt_params(optimizer)
        chk = NormCheck(False, None, losses=[float("nan")] if nan_loss else [])
        self._primary = self._primary or optimizer
        reason = (
            "the loss is NaN: no loss scale can fix it"
            if nan_loss
            else f"GradScaler skipped {self._scaler_skips} steps in a row (scale {scale:.3g}): "
            "the gradients overflow even unscaled"
        )
        try:
            self._failure(chk, params, [], opt=optimizer, note=reason)
        finally:
            self._hidden_grads = []
            self._record(None, None)
            self._end_step()

    # --- healthy steps: back-off, clipping, snapshots --------------------------------------------
    def _apply_to_grads(
        self,
        params: Sequence[torch.Tensor],
        opt: torch.optim.Optimizer | None = None,
        total_norm: float | None = None,
    ) -> None:
        """A healthy step under a back-off: clip, and scale the learning rate (or gradients)."""
        scale = self.recovery.lr_scale
        clip = self.recovery.clip_norm
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
        if scale != 1.0:
            if opt is not None:
                self._saved_lrs = [g["lr"] for g in opt.param_groups]
                for g in opt.param_groups:
                    g["lr"] = g["lr"] * scale
            else:
                # a hand-written update reads the gradient: scale it instead of a learning rate
                grads = [p.grad for p in params if p.grad is not None]
                if grads:
                    torch._foreach_mul_(grads, scale)

    def _maybe_snapshot(self, before_update: bool) -> None:
        if self.policy == "raise":
            return
        roots = self._roots()
        if not before_update and roots and self._small_buffers(roots):
            self._buffer_copy = [b.detach().clone() for b in floating_buffers(roots)]
        # the first snapshot is taken before the first update; then every N steps after one
        if before_update and self.snapshots.last is not None:
            return
        if not before_update and not self.snapshots.due(self.step + 1):
            return
        opt = self._primary
        watched = self._watched_params()
        if not all_finite(watched):
            return  # never keep non-finite weights as the "last good" state
        self.snapshots.take(
            self.step if before_update else self.step + 1,
            watched,
            module_buffers(roots),
            [opt] if opt is not None else [],
            self._schedulers_of(opt),
            self._scalers_all(),
        )

    @staticmethod
    def _small_buffers(roots: Sequence[nn.Module]) -> bool:
        return sum(b.numel() for b in floating_buffers(roots)) <= 1 << 20

    # --- bookkeeping -----------------------------------------------------------------------------
    def _record(self, g: NormCheck | None, p: NormCheck | None) -> None:
        lr = None
        if self._primary is not None and self._primary.param_groups:
            lr = _plain(self._primary.param_groups[0].get("lr"))
            if isinstance(lr, float):
                lr *= self.recovery.lr_scale
        n_loss = self._n_losses if g is not None else 0
        loss = math.fsum(g.losses[:n_loss]) if g is not None and n_loss else self._carry_loss
        self._carry_loss = None
        opt_name = type(self._primary).__name__ if self._primary is not None else None
        gnorm = g.norm if g is not None else None
        rec = StepRecord(
            step=self.step,
            loss=loss,
            update_norm=update_norm_estimate(
                opt_name, lr if isinstance(lr, float) else None, gnorm, self._num_params()
            ),
            grad_norm=gnorm,
            param_norm=p.norm if p is not None else None,
            lr=lr if isinstance(lr, float) else None,
            finite=(g is None or g.finite) and (p is None or p.finite),
            skipped=self.step_was_skipped,
            event=self._event_tag,
        )
        self._event_tag = None
        if g is not None and g.per_tensor:
            rec.layer_values = g.per_tensor
            rec.layer_names = self._layer_names(g.index)
        self.history.append(rec)

    _event_tag: str | None = None
    _copy_size: tuple[tuple[int, int, int, int], int] | None = None
    _usual_gn: tuple[int, float | None] | None = None
    _n_params: int | None = None
    _names_for: tuple[int, list[int], list[str]] | None = None

    def _layer_names(self, index: list[int]) -> list[str]:
        """Names for the per-tensor norms, computed once and shared by every step's record."""
        names = self._param_names()
        cached = self._names_for
        if cached is not None and cached[0] == id(names) and cached[1] == index:
            return cached[2]
        params = self._watched_params()
        out = [names.get(id(params[i]), f"param{i}") if i < len(params) else f"param{i}" for i in index]
        self._names_for = (id(names), list(index), out)
        return out

    def _num_params(self) -> int:
        if self._n_params is None:
            self._n_params = sum(p.numel() for p in self._watched_params())
        return self._n_params

    def _end_step(self) -> None:
        self.step += 1
        self._losses = []
        self._clip_norms = []
        self._sinks = []
        self._pending = None
        self.recorder.new_step()
        for fn in self.on_step_end:
            fn()

    # --- failures ---------------------------------------------------------------------------------
    def _failure(
        self,
        chk: NormCheck,
        params: Sequence[torch.Tensor],
        bad_ranks: Sequence[int],
        opt: torch.optim.Optimizer | None,
        note: str | None = None,
    ) -> None:
        finding: Finding | None = None
        diag: Diagnosis | None = None
        if not chk.finite or not bad_ranks:
            finding = self._locate(chk, params)
            if note:
                finding.details["note"] = note
            if not self.history.healthy():
                finding.details.setdefault("first_step", True)
            diag = diagnose(finding, self.history, self.context(opt))
        if _dist.active():
            finding, diag = _dist.share(finding, diag, bad_ranks)
        assert finding is not None and diag is not None
        self._act(finding, diag, params, opt)

    def _locate(self, chk: NormCheck, params: Sequence[torch.Tensor]) -> Finding:
        finding = None
        extra: dict[str, Any] = {}
        if self.replay_enabled and self.recorder.events:
            finding, extra = replay(
                self.recorder.events, model=self.model, modules=self.modules, step=self.step,
                sinks=self._sinks,
            )
        if finding is None:
            finding = self._watch_finding(chk, params)
            if self.replay_enabled:
                finding.details.setdefault(
                    "note",
                    "the replay of this step did not reproduce the non-finite value; "
                    "run with nanguard.locate() / --trace for the exact op",
                )
        scale = extra.get("activation_scale") or []
        if scale:
            finding.details.setdefault("activation_scale", scale[:32])
        if _dist.active():
            finding.rank = _dist.rank()
        return finding

    def _act(
        self,
        finding: Finding,
        diag: Diagnosis,
        params: Sequence[torch.Tensor],
        opt: torch.optim.Optimizer | None,
        rollback_weights: bool = False,
        after_update: bool = False,
    ) -> None:
        """Carry out the policy's decision for a non-finite step (before its update, or — for
        an update that made the weights non-finite — right after it)."""
        self.findings.append((finding, diag))
        eps = None
        if opt is not None and opt.param_groups:
            e = opt.param_groups[0].get("eps")
            eps = float(e) if isinstance(e, (int, float)) else None
        action = self.recovery.decide(
            diag, self.step, _clip_suggestion(self.history), eps, self.history.median_update_ratio()
        )
        if action.kind == "raise":
            raise NonFiniteError(finding, diag)
        if action.kind == "give_up":
            self.recovery.record(self.step, action, cause=diag.cause.value)
            raise GiveUpError(finding, diag, reason=action.reason, attempts=self.recovery.attempts())
        details: dict[str, Any] = {"cause": diag.cause.value}
        if finding.rank is not None:
            details["rank"] = finding.rank
        if action.kind == "drop_batch":
            samples = finding.details.get("samples") or []
            details["samples"] = [s.get("index") for s in samples]
            details["input"] = finding.details.get("input_name") or finding.source
        if action.kind == "rollback" or rollback_weights:
            snap = self.snapshots.last
            if snap is not None:
                Snapshotter.restore(
                    snap,
                    self._watched_params(),
                    module_buffers(self._roots()),
                    [opt] if opt is not None else [],
                    self._schedulers_of(opt),
                    self._scalers_all(),
                )
                details["restored_step"] = snap.step
                details["steps_lost"] = self.step - snap.step
                self._weights_ok = True  # a snapshot only ever holds finite weights
            else:
                details["restored_step"] = None
                details["note"] = "no snapshot yet: the update was skipped instead"
        if action.set_eps is not None and opt is not None:
            for g in opt.param_groups:
                if "eps" in g and isinstance(g["eps"], (int, float)) and g["eps"] < 1e-12:
                    g["eps"] = action.set_eps
        self._restore_poisoned_buffers()
        self.recovery.record(self.step, action, **details)
        self._event_tag = action.kind
        self.step_was_skipped = True
        if after_update:
            return
        # never apply this update: hide the gradients from the optimizer (restored after step)
        if opt is not None:
            self._hidden_grads = [(p, p.grad) for p in params]
            for p in params:
                p.grad = None
        else:
            for p in params:  # a hand-written update follows: make it a no-op
                if p.grad is not None:
                    p.grad.zero_()

    def _restore_poisoned_buffers(self) -> None:
        bufs = floating_buffers(self._roots())
        if not bufs or all_finite(bufs):
            return
        src = self._buffer_copy
        if src is None and self.snapshots.last is not None:
            src = self.snapshots.last.buffers
        if src is None:
            return
        with torch.no_grad():
            for b, v in zip(bufs, src):
                if b.shape == v.shape and not bool(torch.isfinite(b).all()):
                    b.copy_(v)

    def _watch_finding(self, chk: NormCheck, params: Sequence[torch.Tensor]) -> Finding:
        names = self._param_names()
        bad = [params[i] for i in chk.bad if i < len(params)]
        if bad:
            g = bad[0].grad
            assert g is not None
            pnames = [names.get(id(p), "?") for p in bad]
            return finding_for(
                g,
                "backward",
                None,
                module=pnames[0].rsplit(".", 1)[0] if "." in pnames[0] else "",
                step=self.step,
                reached="gradients",
                detected_by="watch",
                details={"gradients": pnames},
            )
        return Finding(
            phase="forward",
            op=None,
            step=self.step,
            reached="loss",
            detected_by="watch",
            details={"losses": [v if math.isfinite(v) else str(v) for v in chk.losses]},
        )

    def _optimizer_finding(
        self, opt: torch.optim.Optimizer, pchk: NormCheck, step: int, wnames: Sequence[str]
    ) -> tuple[Finding, Diagnosis]:
        """The weights (or the optimizer state) were finite before ``step``'s update and are
        not after it. The step is replayed op by op when a copy from before it was affordable."""
        weights, _ = self._weights(opt)
        badn = [wnames[i] for i in pchk.bad if i < len(wnames)]
        first = weights[pchk.bad[0]] if pchk.bad else weights[0]
        params = [n for n in badn if ":" not in n]
        state = [n for n in badn if ":" in n]
        grads_finite = self._pending is None or self._pending.finite
        finding = self._replay_optimizer(opt, step)
        if finding is None:
            loc = user_frame(2)
            finding = finding_for(
                first,
                "optimizer",
                f"{type(opt).__name__}.step",
                source=loc.short if loc else None,
                source_code=loc.code if loc else None,
                step=step,
                reached="parameters" if params else "optimizer state",
                detected_by="watch",
                details={"note": "the op inside the optimizer step was not replayed (a copy of the "
                         "state before each step costs too much here); nanguard run --trace names it"},
            )
        name0 = (params or state or ["?"])[0].split(":")[0]
        if finding.module is None:
            finding.module = name0.rsplit(".", 1)[0] if "." in name0 else ""
        finding.rank = _dist.rank() if _dist.active() else None
        finding.details.setdefault("parameters", params)
        if state:
            finding.details["optimizer_state"] = state
        rec = next((r for r in reversed(self.history.last(3)) if r.step == step), None)
        if rec is not None:  # checked after the update: the step's record holds its gradients
            grads_finite = rec.finite
        finding.details["grads_finite"] = grads_finite
        gn = rec.grad_norm if rec is not None else (self._pending.norm if self._pending else None)
        if gn is not None:
            finding.details["grad_norm"] = gn
        return finding, diagnose(finding, self.history, self.context())

    def _parameter_finding(self, pchk: NormCheck, wnames: Sequence[str]) -> tuple[Finding, Diagnosis]:
        """Weights non-finite before the first update: they came in that way."""
        weights, _ = self._weights(self._primary) if self._primary is not None else ([], [])
        badn = [wnames[i] for i in pchk.bad if i < len(wnames)]
        first = weights[pchk.bad[0]] if pchk.bad and weights else None
        name0 = badn[0] if badn else "?"
        if not self._updated:
            self._bad_from_start.update(n.split(":")[0] for n in badn)
        finding = finding_for(
            first,
            "forward",
            "parameter",
            module=name0.rsplit(".", 1)[0] if "." in name0 else "",
            step=self.step,
            reached="parameters",
            detected_by="watch",
            rank=_dist.rank() if _dist.active() else None,
            details={"origin": "parameter", "parameters": badn,
                     "note": "found before the first update: the weights came in non-finite"},
        )
        return finding, diagnose(finding, self.history, self.context())

    # --- replaying an optimizer step ------------------------------------------------------------
    def _keep_for_replay(self, opt: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> None:
        """Before a healthy update: keep a copy of weights, gradients and state — when they are
        at most 64 MB together and copying them costs under 2 % of a step (until a step time is
        known: when under 16 MB) — so an update that makes the weights non-finite can be replayed
        op by op. Larger models get the optimizer named (``Adam.step``) instead of the op."""
        now = time.perf_counter()
        if self._last_pre is not None:
            self._step_times.append(now - self._last_pre)
            del self._step_times[:-20]
        self._last_pre = now
        # sizes change only when the state fills in (or a model is cast): measured again then,
        # and every 256 steps
        key = (id(opt), len(params), len(opt.state), self.step // 256)
        if self._copy_size is None or self._copy_size[0] != key:
            states = [v for p in params for v in opt.state.get(p, {}).values() if isinstance(v, torch.Tensor)]
            self._copy_size = (key, sum(t.numel() * t.element_size() for t in [*params, *states]) * 2)
        nbytes = self._copy_size[1]
        if nbytes > 64 << 20:
            self._pre_copy = None
            return
        if self._step_times and self._copy_times:
            # medians: one slow copy (a page fault, a busy core) must not switch copying off
            step_time = sorted(self._step_times)[len(self._step_times) // 2]
            copy_time = sorted(self._copy_times)[len(self._copy_times) // 2]
            probe = self.step % 50 == 0  # measure again now and then, even when off
            if copy_time > self.REPLAY_COPY_BUDGET * step_time and not probe and not self._update_at_risk(opt):
                self._pre_copy = None
                return
        elif nbytes > 16 << 20:
            self._pre_copy = None
            return
        t0 = time.perf_counter()
        with torch.no_grad():
            self._pre_copy = (
                self.step,
                [p.detach().clone() for p in params],
                [None if p.grad is None else p.grad.detach().clone() for p in params],
                {p: {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in opt.state[p].items()}
                 for p in params if p in opt.state},
            )
        self._copy_times.append(time.perf_counter() - t0)
        del self._copy_times[:-9]

    def _update_at_risk(self, opt: torch.optim.Optimizer) -> bool:
        """Could this update turn finite gradients into non-finite weights or state? Then the copy
        to replay it is kept whatever it costs: gradients large enough for their squares to near
        float32's range (Adam's ``exp_avg_sq``), a gradient norm 100× its usual size, or an
        ``eps`` of 0 (0/0 where a gradient is exactly 0)."""
        chk = self._pending
        norm = chk.norm if chk is not None else None
        if norm is not None and not norm < 1e15:
            return True
        if norm is not None:
            # the median of the last 50 norms, refreshed every 16 steps: this runs at every step
            if self._usual_gn is None or self._usual_gn[0] != self.step // 16:
                self._usual_gn = (self.step // 16, self.history.median("grad_norm", 50))
            usual = self._usual_gn[1]
            if usual is not None and usual > 0 and norm > 100 * usual:
                return True
        return any(isinstance(g.get("eps"), (int, float)) and g["eps"] < 1e-12 for g in opt.param_groups)

    def _replay_optimizer(self, opt: torch.optim.Optimizer, step: int) -> Finding | None:
        """Run ``step``'s update again from the copy made before it, under the locator, then put
        everything back as it is now. ``None`` when no copy was kept."""
        copy = self._pre_copy
        raw = getattr(type(opt).step, "__wrapped__", None)
        if copy is None or copy[0] != step or raw is None:
            return None
        _, pclones, gclones, sclones = copy
        params = self._opt_params(opt)
        with torch.no_grad():
            now_p = [p.detach().clone() for p in params]
            now_s = {p: dict(opt.state[p]) for p in params if p in opt.state}
        now_g = [p.grad for p in params]
        from .locator import LocateOptions

        loc = Locator(self.model, modules=self.modules, options=LocateOptions(
            on_sink="record", unused="ignore", step=step, detected_by="replay", phase="optimizer",
            optimizer="op_by_op"))
        try:
            with torch.no_grad():
                for p, c, g in zip(params, pclones, gclones):
                    p.copy_(c)
                    p.grad = None if g is None else g.clone()
                for p in params:
                    opt.state.pop(p, None)
                for p, st in sclones.items():
                    opt.state[p] = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in st.items()}
            with loc:
                raw(opt)
        except Exception:  # a replay is evidence, never a new failure
            return None
        finally:
            with torch.no_grad():
                for p, c, g in zip(params, now_p, now_g):
                    p.copy_(c)
                    p.grad = g
                for p in params:
                    opt.state.pop(p, None)
                for p, st in now_s.items():
                    opt.state[p] = st
        return loc.findings[0] if loc.findings else None

    def report(self) -> str:
        """A plain-text summary: steps, recoveries and every finding with its diagnosis."""
        from ..core.render import format_finding

        head = (
            f"nanguard: {self.step} steps, {len(self.findings)} non-finite events, "
            f"{self.total_notfinite} skipped or rolled back"
        )
        lines = [head] + [f"  step {r['step']}: {r['description']} ({r['reason']})" for r in self.recoveries]
        body = [format_finding(f, d) for f, d in self.findings]
        return "\n\n".join(["\n".join(lines), *body])


def _param_norm(chk: NormCheck, names: Sequence[str]) -> float | None:
    """The weights' 2-norm from a check over weights and optimizer state."""
    vals = [v for v, n in zip(chk.per_tensor, names) if ":" not in n]
    if not vals:
        return chk.norm
    sq = math.fsum(v * v for v in vals)
    return math.sqrt(sq) if math.isfinite(sq) else float("inf")


def _scale(scaler: Any) -> float:
    try:
        return float(scaler.get_scale())
    except Exception:
        return float("nan")


def _clip_suggestion(h: History) -> float | None:
    from ..core.diagnosis import _clip_threshold

    return _clip_threshold(h) if h.series("grad_norm", 200) else None


def _plain(v: Any) -> Any:
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        return float(v.item())
    if isinstance(v, tuple):
        return tuple(_plain(x) for x in v)
    return v


def _state_summary(opt: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in params:
        st = opt.state.get(p, {})
        for k, v in st.items():
            if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() > 1:
                n, pi, ni = counts(v)
                out[k] = {
                    "nonfinite": n + pi + ni,
                    "zeros": int((v == 0).sum()),
                    "min": float(v.nan_to_num().min()),
                }
    return out


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
    """
    return Guard(
        model,
        optimizer,
        policy=policy,
        replay=replay,
        max_consecutive_skips=max_consecutive_skips,
        lr_factor=lr_factor,
        max_recoveries=max_recoveries,
        recovery_window=recovery_window,
        snapshot_every=snapshot_every,
        snapshot_dir=snapshot_dir,
        on_unfixable=on_unfixable,
        schedulers=schedulers,
        scaler=scaler,
    ).install()
