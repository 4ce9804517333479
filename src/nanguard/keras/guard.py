"""The Keras guard: watch every step, replay the failing one, apply the policy.

What runs when, in a training step (``model.fit`` or a custom loop)::

    with tf.GradientTape() as tape:
        loss = ...                               # traced or eager: nothing added
    grads = tape.gradient(loss, variables)       # the target is recorded as the step's loss
    optimizer.apply_gradients(zip(grads, vars))  # traced into the step (watch.guarded_apply):
                                                 #   one fused check of loss + gradients;
                                                 #   finite -> the update (back-off, clipping);
                                                 #   else   -> no update, state put back
    # after the step, in Python (one read of a small vector):
    #   healthy        -> history, snapshot
    #   loss/gradients -> replay the step under the locator -> diagnose -> policy
    #   weights after  -> optimizer finding -> diagnose -> policy (rollback)

The step drivers are :class:`~nanguard.keras.NanGuard` (``model.fit``), :meth:`KerasGuard.wrap`
(a custom loop's step function) and, under ``nanguard run``, any ``tf.function`` whose trace
contains a guarded update. An optimizer updated eagerly outside any step driver is checked right
after its update (without a replay: no batch is known there).
"""

from __future__ import annotations

import functools
import math
import os
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from ..core.config import POLICIES
from ..core.diagnosis import Diagnosis, RunContext, _clip_threshold, diagnose
from ..core.errors import GiveUpError, NonFiniteError
from ..core.finding import Finding
from ..core.history import History, StepRecord
from ..core.ops import update_norm_estimate
from ..core.policy import Action, Recovery, RecoveryCounters, loss_scale_gave_up
from ..core.source import user_frame
from . import _patches
from ._compat import keras, unwrap_optimizer, var_path
from ._stats import finding_for
from .replay import replay, replay_of, state_variables
from .snapshot import Snapshotter
from .watch import GuardState, StepStats

__all__ = ["KerasGuard", "attach"]

F = TypeVar("F", bound=Callable[..., Any])
#: called only when a replay is needed: (the step function to run again, its named batch tensors)
Prepare = Callable[[], tuple[Callable[[], Any], Sequence[tuple[str, Any]]]]
_HYPER = ("momentum", "beta_1", "beta_2", "weight_decay", "rho", "nesterov")


class KerasGuard(RecoveryCounters):
    """The handle :func:`attach` returns (and what :class:`~nanguard.keras.NanGuard` drives).

    Attributes:
        step: index of the update in progress (0 for the first).
        history: per-step loss, gradient norm, weight norm and learning rate.
        findings: ``(Finding, Diagnosis)`` for every non-finite event, in order.
        recoveries: what the policy did, one dict per event (the run log's ``recoveries``).
        step_was_skipped: whether the last step's update was skipped.
    """

    def __init__(
        self,
        model: Any = None,
        optimizer: Any = None,
        *,
        policy: str = "raise",
        replay: bool = True,
        max_consecutive_skips: int = 10,
        lr_factor: float = 0.5,
        max_recoveries: int = 5,
        recovery_window: int = 1000,
        snapshot_every: int = 50,
        on_unfixable: str = "raise",
        history_size: int = 10_000,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(
                f"nanguard.keras: policy={policy!r}; valid policies are {', '.join(POLICIES)}."
            )
        if model is not None and not isinstance(model, keras.layers.Layer):
            raise TypeError(
                f"nanguard.keras.attach(model=...) expects a Keras model or layer, got "
                f"{type(model).__name__}."
            )
        if optimizer is not None and not isinstance(optimizer, keras.optimizers.Optimizer):
            raise TypeError(
                f"nanguard.keras.attach(optimizer=...) expects a keras.optimizers.Optimizer, got "
                f"{type(optimizer).__name__}."
            )
        self.model = model
        self.policy = policy
        self.recovery = Recovery(
            policy=policy,
            max_consecutive_skips=max_consecutive_skips,
            lr_factor=lr_factor,
            max_recoveries=max_recoveries,
            window=recovery_window,
            on_unfixable=on_unfixable,
        )
        self.snapshots = Snapshotter(every=snapshot_every)
        self.replay_enabled = replay
        self.history = History(maxlen=history_size)
        self.findings: list[tuple[Finding, Diagnosis]] = []
        self.step = 0
        self.step_was_skipped = False
        self.notes: list[str] = []
        self._optimizers: list[Any] = [optimizer] if optimizer is not None else []
        self._states: dict[int, GuardState] = {}
        self._fn_steps: weakref.WeakSet[Any] = weakref.WeakSet()
        self._installed = False
        self._scaler_skips = 0
        self._event: str | None = None
        self.on_step_end: list[Callable[[], None]] = []  # run after each step (live status, ...)
        #: NANGUARD_VERIFY=1: after every step, check that no weight and no optimizer variable is
        #: non-finite (the guarantee of skip/recover); breaches are kept here
        self.verify = os.environ.get("NANGUARD_VERIFY", "") == "1"
        self.violations: list[dict[str, Any]] = []
        self._updated = False  # an update has been applied in this run

    # --- lifecycle ---------------------------------------------------------------------------------
    def install(self) -> KerasGuard:
        if self._installed:
            return self
        _patches.install()
        self._installed = True
        try:
            for opt in list(self._optimizers):
                self.adopt(opt)
            for st in self._states.values():
                if _patches.registered_owner(st.optimizer) is None:
                    _patches.adopt(st.optimizer, st, self)
        except BaseException:
            self.detach()
            raise
        if self.policy != "raise":
            self.build_optimizers()
        self._initial_snapshot()
        return self

    def detach(self) -> None:
        """Stop watching. Safe to call twice."""
        if not self._installed:
            return
        for st in self._states.values():
            _patches.release(st.optimizer)
        # the states stay: a step traced while attached keeps writing to them, and a later
        # install (the next fit with the same NanGuard) adopts them again
        self._installed = False
        _patches.uninstall()

    def __enter__(self) -> KerasGuard:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def bind(self, model: Any, optimizers: Sequence[Any] = ()) -> None:
        """Watch ``model`` (and its optimizer(s)) from now on: what ``NanGuard`` does in fit."""
        if model is not None:
            self.model = model
        for opt in optimizers:
            if opt is not None and all(opt is not o for o in self._optimizers):
                self._optimizers.append(opt)
            if self._installed:
                self.adopt(opt)
        if self._installed:
            for st in self._states.values():
                st.set_state(*self._state_vars())
            if self.policy != "raise":
                self.build_optimizers()
            self._initial_snapshot()

    def adopt(self, optimizer: Any) -> GuardState:
        """Guard ``optimizer``'s updates (the one inside a ``LossScaleOptimizer``)."""
        inner = unwrap_optimizer(optimizer)
        st = self._states.get(id(inner))
        if st is not None and st.optimizer is inner:
            if self._installed and _patches.registered_owner(inner) is None:
                _patches.adopt(inner, st, self)
            return st
        other = _patches.registered_owner(inner)
        if other is not None and other is not self:
            raise RuntimeError(
                "nanguard is already guarding this optimizer. Detach the first guard "
                "(guard.detach(), or leave its `with` block) before attaching another."
            )
        st = GuardState(inner, *self._state_vars())
        if inner is not optimizer:
            st.wrapper = optimizer
        st.on_trace = self._snapshot_before_first_update
        st.lr_scale.assign(float(self.recovery.lr_scale))  # a back-off already made persists
        if self.recovery.clip_norm is not None:
            st.clip.assign(float(self.recovery.clip_norm))
        self._states[id(inner)] = st
        if all(optimizer is not o for o in self._optimizers):
            self._optimizers.append(optimizer)
        _patches.adopt(inner, st, self)
        return st

    def _state_vars(self) -> tuple[list[Any], list[Any]]:
        if self.model is None:
            return [], []
        try:
            nt = list(self.model.non_trainable_variables)
            mv = list(self.model.metrics_variables)
        except Exception:
            return [], []
        return nt, mv

    # --- step drivers ---------------------------------------------------------------------------------
    def wrap(self, fn: F) -> F:
        """Decorate a custom loop's step function (a ``tf.function`` or plain Python)::

            @guard.wrap
            @tf.function
            def train_step(x, y):
                with tf.GradientTape() as tape:
                    loss = loss_fn(y, model(x, training=True))
                grads = tape.gradient(loss, model.trainable_variables)
                optimizer.apply_gradients(zip(grads, model.trainable_variables))
                return loss

        After each call the guard reads the step's check; on a non-finite value it runs the
        step's Python function again, eagerly, on the same arguments, to find the origin.
        """
        py = getattr(fn, "python_function", None) or fn

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with _patches.in_step():
                out = fn(*args, **kwargs)
            self.after_step(replay_of(py, args, kwargs))
            return out

        return wrapper  # type: ignore[return-value]

    def after_step(self, prepare: Prepare | None = None, states: Sequence[GuardState] | None = None) -> str:
        """Read the check of the step that just ran; act on it. Returns ``"healthy"``,
        ``"skipped"`` (the update was not applied, or was rolled back) or ``"none"``.

        ``prepare()``, called only when a replay is needed, returns the step function to run
        again and the named tensors of its batch."""
        try:
            return self._after_step(prepare, states)
        finally:
            if self.verify and self.policy != "raise":
                self._verify()
            for fn in self.on_step_end:
                fn()

    def _verify(self) -> None:
        """``NANGUARD_VERIFY=1``: the guarantee of ``skip``/``recover`` after a step."""
        bad = [
            var_path(v)
            for st in self._states.values()
            for v in [*st.var_refs, *st.slot_refs]
            if not _finite(v)
        ]
        if bad and self._updated:  # weights that came in bad (a checkpoint) are no breach
            self.violations.append({"step": self.step - 1, "tensors": bad[:8]})

    def _after_step(self, prepare: Prepare | None, states: Sequence[GuardState] | None) -> str:
        ran: list[tuple[GuardState, StepStats]] = []
        for st in states if states is not None else list(self._states.values()):
            s = st.read()
            if s.count != st.last_count:
                st.last_count = s.count
                ran.append((st, s))
        if not ran:
            return self._no_update(prepare)
        self._scaler_skips = 0
        self.step_was_skipped = False
        bad = next(((st, s) for st, s in ran if not s.finite), None)
        if bad is not None:
            self._before_update_failure(bad[0], bad[1], prepare)
            return "skipped"
        bad = next(((st, s) for st, s in ran if not s.params_finite), None)
        if bad is not None:
            self._after_update_failure(bad[0], bad[1])
            return "skipped"
        self.recovery.healthy_step()
        self._updated = True
        self._record(ran[0][0], ran[0][1], finite=True)
        self.step += 1
        self._maybe_snapshot()
        return "healthy"

    # hooks called by _patches ------------------------------------------------------------------
    def after_eager_apply(self, state: GuardState) -> None:
        self.after_step(None, states=[state])

    def traced_in_function(self, fn: Any) -> None:
        try:
            self._fn_steps.add(fn)
        except TypeError:
            pass

    def is_step_function(self, fn: Any) -> bool:
        try:
            return fn in self._fn_steps
        except TypeError:
            return False

    def _no_update(self, prepare: Prepare | None) -> str:
        """The step ran but no guarded update did: a LossScaleOptimizer skipped it."""
        opts = [o for o in self._optimizers if unwrap_optimizer(o) is not o]
        if not opts or prepare is None:
            return "none"
        self._scaler_skips += 1
        bad_loss = self._loss_metric_nonfinite()
        scale = _used_scale(opts[0])
        if not bad_loss and not loss_scale_gave_up(scale, self._scaler_skips, self.recovery.max_consecutive_skips):
            # the scaled gradients overflowed and the optimizer lowers its scale: its business
            self.step_was_skipped = True
            self._event = "scaler-skip"
            self.history.append(StepRecord(step=self.step, skipped=True, finite=False, event="scaler-skip"))
            self.step += 1
            return "skipped"
        st = self._states.get(id(unwrap_optimizer(opts[0])))
        if st is None:
            return "none"
        fake = StepStats(self._scaler_skips, False, False, False, None, float("nan"), None, True, None)
        note = (
            "the loss itself is not finite: no loss scale can fix it"
            if bad_loss
            else f"LossScaleOptimizer skipped {self._scaler_skips} steps in a row"
            + (f" (scale {scale:.3g}): the gradients overflow even unscaled" if scale is not None else "")
        )
        self._scaler_skips = 0
        self._before_update_failure(st, fake, prepare, note=note)
        return "skipped"

    def _loss_metric_nonfinite(self) -> bool:
        """After a step the LossScaleOptimizer skipped: did Keras' loss tracker (the unscaled
        loss) go non-finite? Then the forward pass, not the scale, is the problem."""
        model = self.model
        tracker = getattr(model, "_loss_tracker", None) if model is not None else None
        return any(not _finite(v) for v in getattr(tracker, "variables", []) or [])

    # --- failures --------------------------------------------------------------------------------------
    def _before_update_failure(
        self,
        state: GuardState,
        s: StepStats,
        prepare: Prepare | None,
        note: str | None = None,
    ) -> None:
        finding = self._locate(state, s, prepare)
        if note:
            finding.details["note"] = note
        if not self.history.healthy():
            finding.details.setdefault("first_step", True)
        diag = diagnose(finding, self.history, self.context(state))
        self._act(finding, diag, state, s, after_update=False)

    def _after_update_failure(self, state: GuardState, s: StepStats) -> None:
        finding = self._optimizer_finding(state, s)
        diag = diagnose(finding, self.history, self.context(state))
        self._act(finding, diag, state, s, after_update=True)

    def _locate(
        self,
        state: GuardState,
        s: StepStats,
        prepare: Prepare | None,
    ) -> Finding:
        finding: Finding | None = None
        extra: dict[str, Any] = {}
        if self.replay_enabled and prepare is not None:
            replay_fn, batch = prepare()
            finding, extra = replay(
                replay_fn, model=self.model, optimizers=self._optimizers, batch=batch, step=self.step
            )
        if finding is None:
            finding = self._watch_finding(state, s)
            if not self.replay_enabled:
                pass
            elif prepare is None:
                finding.details.setdefault(
                    "note",
                    "this update ran outside a step nanguard can replay: decorate the step "
                    "function with guard.wrap, or use nanguard.keras.locate() / --trace, for the "
                    "exact op",
                )
            else:
                errs = "; ".join(extra.get("errors") or [])
                finding.details.setdefault(
                    "note",
                    "the replay of this step did not reproduce the non-finite value"
                    + (f" ({errs})" if errs else "")
                    + "; nanguard.keras.locate() / --trace names the exact op",
                )
        scale = extra.get("activation_scale") or []
        if scale:
            finding.details.setdefault("activation_scale", [list(x) for x in scale[:32]])
        if finding.step is None:
            finding.step = self.step
        return finding

    def _watch_finding(self, state: GuardState, s: StepStats) -> Finding:
        names = state.var_names
        bad = [i for i, v in enumerate(s.grad_norms) if not math.isfinite(v)]
        if s.loss_finite and bad:
            pnames = [names[i] for i in bad if i < len(names)]
            first = pnames[0] if pnames else ""
            return Finding(
                phase="backward",
                op=None,
                module=first.rsplit("/", 1)[0] if "/" in first else None,
                step=self.step,
                reached="gradients",
                detected_by="watch",
                framework="keras",
                details={"gradients": pnames},
            )
        return Finding(
            phase="forward",
            op=None,
            step=self.step,
            reached="loss",
            detected_by="watch",
            framework="keras",
            details={"losses": [s.loss if s.loss is not None and math.isfinite(s.loss) else str(s.loss)]},
        )

    def _optimizer_finding(self, state: GuardState, s: StepStats) -> Finding:
        opt = state.optimizer
        bad = [v for v in state.var_refs if not _finite(v)]
        bad_slots = [v for v in state.slot_refs if not _finite(v)]
        reached = "parameters"
        owner_of_slot: Any = None
        if not bad and bad_slots:
            bad, reached = bad_slots, "optimizer state"
            key = var_path(bad[0]).replace("/", "_")
            owner_of_slot = next(
                (v for v in state.var_refs if var_path(v).replace("/", "_") in key), None
            )
        pnames = [var_path(v) for v in bad]
        layer_of = var_path(owner_of_slot) if owner_of_slot is not None else (pnames[0] if pnames else "")
        first = bad[0] if bad else (state.var_refs[0] if state.var_refs else None)
        loc = user_frame(2)
        return finding_for(
            first,
            "optimizer",
            f"{type(opt).__name__}.apply",
            module=layer_of.rsplit("/", 1)[0] if "/" in layer_of else None,
            source=loc.short if loc else None,
            source_code=loc.code if loc else None,
            step=self.step,
            reached=reached,
            detected_by="watch",
            details={
                "parameters": pnames,
                "grads_finite": True,
                "grad_norm": s.grad_norm if math.isfinite(s.grad_norm) else None,
                "state": _slot_summary(opt, bad[:1]),
                "note": "the ops inside the optimizer's update are not replayed; "
                "nanguard.keras.locate() / nanguard run --trace names them",
            },
        )

    def _act(
        self,
        finding: Finding,
        diag: Diagnosis,
        state: GuardState,
        s: StepStats,
        after_update: bool,
    ) -> None:
        """Carry out the policy's decision. Before the update (``after_update=False``) the traced
        step has already skipped it; after it, the weights are rolled back to the snapshot."""
        self.findings.append((finding, diag))
        eps = self._eps(state)
        action = self.recovery.decide(
            diag, self.step, _clip_suggestion(self.history), eps, self.history.median_update_ratio()
        )
        if action.kind == "raise":
            self._record(state, s, finite=False, event="nonfinite")
            raise NonFiniteError(finding, diag)
        if action.kind == "give_up":
            self.recovery.record(self.step, action, cause=diag.cause.value)
            self._record(state, s, finite=False, event="give_up")
            raise GiveUpError(finding, diag, reason=action.reason, attempts=self.recovery.attempts())
        details: dict[str, Any] = {"cause": diag.cause.value}
        if action.kind == "drop_batch":
            samples = finding.details.get("samples") or []
            details["samples"] = [x.get("index") for x in samples]
            details["input"] = finding.details.get("input_name") or finding.source
        fixed = state.restore_metrics()
        if fixed:
            details["metrics_restored"] = fixed
        if action.kind == "rollback" or after_update:
            snap = self.snapshots.last
            if snap is not None:
                Snapshotter.restore(snap)
                for st in self._states.values():
                    st.refresh_backups()
                details["restored_step"] = snap.step
                details["steps_lost"] = self.step - snap.step
            elif after_update:
                give_up = Action("give_up", "the update made the weights non-finite and there is no "
                                 "snapshot to roll back to")
                self.recovery.record(self.step, give_up, cause=diag.cause.value)
                self._record(state, s, finite=False, event="give_up")
                raise GiveUpError(finding, diag, reason=give_up.reason, attempts=self.recovery.attempts())
            else:
                details["restored_step"] = None
                details["note"] = "no snapshot yet: the update was skipped instead"
        self._apply_recovery_settings(action)
        self.recovery.record(self.step, action, **details)
        self.step_was_skipped = True
        self._record(state, s, finite=False, event=action.kind, skipped=True)
        self.step += 1

    def _apply_recovery_settings(self, action: Action) -> None:
        for st in self._states.values():
            st.lr_scale.assign(float(self.recovery.lr_scale))
            if self.recovery.clip_norm is not None:
                st.clip.assign(float(self.recovery.clip_norm))
            if action.set_eps is not None and st.eps is not None and float(st.eps.numpy()) < 1e-12:
                st.eps.assign(float(action.set_eps))

    def _eps(self, state: GuardState) -> float | None:
        if state.eps is not None:
            return float(state.eps.numpy())
        e = getattr(state.optimizer, "epsilon", None)
        return float(e) if isinstance(e, (int, float)) else None

    # --- context and bookkeeping ------------------------------------------------------------------------
    def context(self, state: GuardState | None = None) -> RunContext:
        """What the diagnosis knows about the optimizer (Keras spelling of the fixes)."""
        if state is None:
            state = next(iter(self._states.values()), None)
        if state is None:
            return RunContext(framework="keras")
        opt = state.optimizer
        hyper: dict[str, Any] = {}
        lr = next((r.lr for r in reversed(list(self.history)) if r.lr is not None), None)
        if lr is None:
            try:
                lr = float(np.asarray(opt.learning_rate)) * self.recovery.lr_scale
            except Exception:
                lr = None
        if lr is not None:
            hyper["lr"] = lr
        eps = self._eps(state)
        if eps is not None:
            hyper["epsilon"] = eps
        for k in _HYPER:
            v = getattr(opt, k, None)
            if isinstance(v, (int, float)):
                hyper[k] = v
        clip = None
        for k in ("global_clipnorm", "clipnorm"):
            v = getattr(opt, k, None)
            if isinstance(v, (int, float)) and v > 0:
                clip = float(v)
        n = sum(int(np.prod(v.shape)) for v in state.var_refs) or None
        return RunContext(
            framework="keras",
            optimizer=type(opt).__name__,
            hyper=hyper,
            clip_norm=clip if clip is not None else self.recovery.clip_norm,
            num_params=n,
        )

    def _record(
        self,
        state: GuardState,
        s: StepStats,
        finite: bool,
        event: str | None = None,
        skipped: bool = False,
    ) -> None:
        opt_name = type(state.optimizer).__name__
        gnorm = s.grad_norm if s.grad_norm is not None else None
        n = state.n_params or None
        rec = StepRecord(
            step=self.step,
            loss=s.loss,
            grad_norm=gnorm,
            param_norm=s.param_norm if finite else None,
            lr=s.lr,
            update_norm=update_norm_estimate(opt_name, s.lr, gnorm, n) if finite else None,
            finite=finite,
            skipped=skipped,
            event=event,
        )
        if s.grad_norms and state.var_names:
            rec.layer_values = s.grad_norms
            rec.layer_names = state.var_names  # one list shared by every step
        self.history.append(rec)

    def _all_variables(self) -> list[Any]:
        vs = state_variables(self.model, self._optimizers)
        if self.model is not None:
            metrics = {id(v) for v in getattr(self.model, "metrics_variables", [])}
            vs = [v for v in vs if id(v) not in metrics]
        return vs

    def build_optimizers(self) -> None:
        """Build unbuilt optimizers on the model's trainable variables, as their first ``apply``
        would: the first snapshot (before any update) then holds their state too."""
        if self.model is None or not getattr(self.model, "built", False):
            return
        from keras.src import backend as kbackend

        for opt in self._optimizers:
            if not getattr(opt, "built", False):
                with kbackend.name_scope(opt.name, caller=opt):
                    opt.build(self.model.trainable_variables)
                opt.built = True

    def _optimizers_built(self) -> bool:
        return bool(self._optimizers) and all(
            getattr(unwrap_optimizer(o), "built", False) for o in self._optimizers
        )

    def _initial_snapshot(self) -> None:
        if self.policy == "raise" or self.snapshots.last is not None:
            return
        if self.model is not None and self._optimizers_built() and self.model.built:
            self.snapshots.take(self.step, self._all_variables())

    def _snapshot_before_first_update(self, optimizer: Any, variables: list[Any]) -> None:
        """Before the first update of a run whose optimizer was built only now (a custom loop,
        ``nanguard run``): the first snapshot, so a rollback is possible from the start."""
        if self.policy == "raise" or self.snapshots.last is not None:
            return
        vs = self._all_variables() if self.model is not None else []
        seen = {id(v) for v in vs}
        for v in [*variables, *getattr(optimizer, "variables", [])]:
            if id(v) not in seen:
                seen.add(id(v))
                vs.append(v)
        self.snapshots.take(self.step, vs)

    def _maybe_snapshot(self) -> None:
        if self.policy == "raise" or not self.snapshots.due(self.step):
            return
        if not self._optimizers_built():
            return
        self.snapshots.take(self.step, self._all_variables())

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


def _finite(v: Any) -> bool:
    return bool(np.isfinite(np.asarray(v.numpy(), dtype=np.float64)).all())


def _clip_suggestion(h: History) -> float | None:
    return _clip_threshold(h) if h.series("grad_norm", 200) else None


def _slot_summary(opt: Any, variables: Sequence[Any]) -> dict[str, Any]:
    """The optimizer's slots (momentum, velocity, ...) of the first bad variable."""
    out: dict[str, Any] = {}
    for v in variables:
        key = var_path(v).replace("/", "_")
        for sv in getattr(opt, "variables", []):
            name = var_path(sv)
            if key and key in name.replace("/", "_") and sv is not v:
                a = np.asarray(sv.numpy(), dtype=np.float64)
                out[name] = {
                    "nonfinite": int((~np.isfinite(a)).sum()),
                    "zeros": int((a == 0).sum()),
                    "min": float(np.nan_to_num(a).min()) if a.size else None,
                }
    return out


def attach(
    model: Any = None,
    optimizer: Any = None,
    *,
    policy: str = "raise",
    replay: bool = True,
    max_consecutive_skips: int = 10,
    lr_factor: float = 0.5,
    max_recoveries: int = 5,
    recovery_window: int = 1000,
    snapshot_every: int = 50,
    on_unfixable: str = "raise",
) -> KerasGuard:
    """Guard a custom training loop (``tf.GradientTape`` + ``optimizer.apply_gradients``).

    ::

        guard = nanguard.keras.attach(model, optimizer, policy="recover")

        @guard.step
        @tf.function
        def train_step(x, y):
            ...
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

    Attach before the step function is first called: the check is traced into it (a step traced
    while attached keeps its check after :meth:`KerasGuard.detach`; retrace it to remove it). The
    policies are those of :func:`nanguard.attach` (``raise``, ``skip``, ``recover``).
    """
    return KerasGuard(
        model,
        optimizer,
        policy=policy,
        replay=replay,
        max_consecutive_skips=max_consecutive_skips,
        lr_factor=lr_factor,
        max_recoveries=max_recoveries,
        recovery_window=recovery_window,
        snapshot_every=snapshot_every,
        on_unfixable=on_unfixable,
    ).install()



def _used_scale(wrapper: Any) -> float | None:
    """The loss scale a ``LossScaleOptimizer`` used for the step it just skipped (it has already
    halved its ``dynamic_scale`` for the next one); ``None`` when it cannot be read."""
    var = getattr(wrapper, "dynamic_scale", None)
    if var is None:
        return None
    try:
        v = 2.0 * float(var.numpy() if hasattr(var, "numpy") else var)
    except Exception:
        return None
    return v if math.isfinite(v) else None
