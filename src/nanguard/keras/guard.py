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
import logging
import math
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..core import config
from ..core.diagnosis import RunContext
from ..core.early import eps_zero
from ..core.handle import GuardHandle, GuardOptions
from ..core.policy import check_policy
from ..core.snapbudget import SnapshotBudget
from ..core.step import StepDriver
from . import _patches
from ._backend import (
    KerasBackend,
    build_optimizers,
    initial_snapshot,
    maybe_snapshot,
    snapshot_before_first_update,
)
from ._compat import keras, unwrap_optimizer, var_path
from ._context import record_reading, run_context
from ._datalook import DataLook
from ._findings import Prepare, finite, optimizer_finding
from .replay import HostRng, replay_of
from .snapshot import Snapshotter
from .watch import GuardState, StepStats

__all__ = ["KerasGuard", "attach"]

#: Keras optimizers whose update divides by a root of a squared-gradient average plus ``epsilon``
_DIVIDES_BY_ROOT = frozenset({"Adam", "AdamW", "Adamax", "Nadam", "RMSprop", "Adagrad", "Adadelta",
                              "Adafactor", "Lamb"})

log = logging.getLogger("nanguard")

F = TypeVar("F", bound=Callable[..., Any])


class KerasGuard(GuardHandle):
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
        check_policy(policy, "nanguard.keras.attach(policy=...)")
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
        self.options = GuardOptions(
            policy=policy, replay=replay, max_consecutive_skips=max_consecutive_skips, lr_factor=lr_factor,
            max_recoveries=max_recoveries, recovery_window=recovery_window, snapshot_every=snapshot_every,
            on_unfixable=on_unfixable, history_size=history_size,
        )
        self.model = model
        self.controller = self.options.controller()
        self.snapshots = Snapshotter(every=snapshot_every)
        #: under ``raise``: when a snapshot to try the advice from is affordable
        self.budget = SnapshotBudget()
        self.replay_enabled = replay
        self.driver = StepDriver(self.controller)
        self.data = DataLook(self.controller)
        self.notes: list[str] = []
        self._optimizers: list[Any] = [optimizer] if optimizer is not None else []
        self._states: dict[int, GuardState] = {}
        self._fn_steps: weakref.WeakSet[Any] = weakref.WeakSet()
        self._installed = False
        #: NANGUARD_VERIFY=1: after every step, check that no weight and no optimizer variable is
        #: non-finite (the guarantee of skip/recover); breaches are kept here
        self.verify = config.verify()
        self.violations: list[dict[str, Any]] = []
        self._updated = False  # an update has been applied in this run

    # --- the public surface, over the step driver ----------------------------------------------------
    @property
    def step(self) -> int:
        return self.driver.step

    @step.setter
    def step(self, value: int) -> None:
        self.driver.step = value

    @property
    def step_was_skipped(self) -> bool:
        """Whether the last step's update was kept from the weights."""
        return self.driver.skipped

    @property
    def on_step_end(self) -> list[Callable[[], None]]:
        """Called after each step (the live status line, the Keras session's step count)."""
        return self.driver.on_end

    @property
    def optimizers(self) -> list[Any]:
        """The optimizers this guard watches (as given: a ``LossScaleOptimizer`` unwrapped only
        for its states)."""
        return list(self._optimizers)

    def fit_started(self, arguments: Any) -> None:
        """``model.fit`` was called: the data look at its arrays (the Keras session)."""
        self.data.fit_started(arguments, self.driver.step)

    def states(self) -> list[GuardState]:
        """The traced check's variables, one per watched optimizer."""
        return list(self._states.values())

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
        initial_snapshot(self)
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
            initial_snapshot(self)

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
        st.on_trace = functools.partial(snapshot_before_first_update, self)
        st.lr_scale.assign(float(self.recovery_state.lr_scale))  # a back-off already made persists
        if self.recovery_state.clip_norm is not None:
            st.clip.assign(float(self.recovery_state.clip_norm))
        self._states[id(inner)] = st
        if all(optimizer is not o for o in self._optimizers):
            self._optimizers.append(optimizer)
        _patches.adopt(inner, st, self)
        self._first_sight(inner)
        return st

    def _first_sight(self, opt: Any) -> None:
        """When an optimizer is adopted (before its first update): ``epsilon=0`` where the update
        divides by a root of the squared-gradient average is a NaN waiting for a zero gradient."""
        eps = getattr(opt, "epsilon", None)
        if type(opt).__name__ in _DIVIDES_BY_ROOT and isinstance(eps, (int, float)) and eps == 0:
            call = f"keras.optimizers.{type(opt).__name__}(epsilon=0)"
            self.controller.early.add(eps_zero(call, [0], 1, self.driver.step))

    def _state_vars(self) -> tuple[list[Any], list[Any]]:
        if self.model is None:
            return [], []
        try:
            nt = list(self.model.non_trainable_variables)
            mv = list(self.model.metrics_variables)
        except Exception:  # a model not built yet: its state is bound when it is
            log.debug("nanguard: the model's state variables cannot be read yet", exc_info=True)
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
            rng = HostRng.capture()  # what the step draws, drawn again by its replay
            with _patches.in_step():
                out = fn(*args, **kwargs)
            self.after_step(replay_of(py, args, kwargs, rng))
            return out

        return wrapper  # type: ignore[return-value]

    def after_step(self, prepare: Prepare | None = None, states: Sequence[GuardState] | None = None) -> str:
        """Read the check of the step that just ran; act on it. Returns ``"healthy"``,
        ``"skipped"`` (the update was not applied, or was rolled back) or ``"none"``.

        ``prepare()``, called only when a replay is needed, returns the step function to run
        again and the named tensors of its batch."""
        step = self.driver.step
        try:
            return self._after_step(prepare, states)
        finally:
            if self.verify and self.policy != "raise":
                self._verify()
            if self.driver.step == step:  # no step ended (no update ran): tell the observers all the same
                for fn in self.on_step_end:
                    fn()

    def _verify(self) -> None:
        """``NANGUARD_VERIFY=1``: the guarantee of ``skip``/``recover`` after a step."""
        bad = [
            var_path(v)
            for st in self._states.values()
            for v in [*st.var_refs, *st.slot_refs]
            if not finite(v)
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
        self.controller.scaler_stepped()
        bad = next(((st, s) for st, s in ran if not s.finite), None)
        state, stats = bad if bad is not None else ran[0]
        after = next(((st, s) for st, s in ran if not s.params_finite), None)
        if bad is None and after is not None:
            state, stats = after
        port = KerasBackend(self, state, stats, prepare)
        d = self.driver
        ok = False
        try:
            # the traced step read loss, gradients and (after its update) the weights at once
            ok = d.check(stats.finite, port, checks_after=True) and d.check_after(
                stats.params_finite, port, lambda: optimizer_finding(self, state, stats))
        finally:
            if not ok:
                self.settings_changed()
            d.end(record_reading(state, stats, ok), finite=ok)
        if not ok:
            return "skipped"
        self._updated = True
        self.data.after_healthy_step(ran[0][0], self.driver.step)
        if port.snapshot_after:
            maybe_snapshot(self)
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
        st = self._states.get(id(unwrap_optimizer(opts[0]))) if opts else None
        if st is None or prepare is None:
            return "none"
        fake = StepStats(1, False, False, False, None, float("nan"), None, True, None)
        port = KerasBackend(self, st, fake, prepare)
        own = False
        try:
            own = self.driver.scaler_skipped(port, nan_loss=self._loss_metric_nonfinite(),
                                             scale=_used_scale(opts[0]), name="LossScaleOptimizer")
        finally:
            # the scaled gradients overflowed and the optimizer lowers its scale: its business
            self.driver.end(None if own else record_reading(st, fake, False), finite=False)
        return "skipped"

    def _loss_metric_nonfinite(self) -> bool:
        """After a step the LossScaleOptimizer skipped: did Keras' loss tracker (the unscaled
        loss) go non-finite? Then the forward pass, not the scale, is the problem."""
        model = self.model
        tracker = getattr(model, "_loss_tracker", None) if model is not None else None
        return any(not finite(v) for v in getattr(tracker, "variables", []) or [])

    def settings_changed(self) -> None:
        """The back-off or the clipping threshold changed (a recovery, a resume): into the
        traced step's variables."""
        self._apply_recovery_settings()

    def _apply_recovery_settings(self) -> None:
        for st in self._states.values():
            st.lr_scale.assign(float(self.recovery_state.lr_scale))
            if self.recovery_state.clip_norm is not None:
                st.clip.assign(float(self.recovery_state.clip_norm))

    # --- context and bookkeeping ------------------------------------------------------------------------
    def context(self, state: GuardState | None = None) -> RunContext:
        """What the diagnosis knows about the optimizer (Keras spelling of the fixes)."""
        return run_context(self, state)

    def build_optimizers(self) -> None:
        """Build unbuilt optimizers on the model's trainable variables, as their first ``apply``
        would: the first snapshot (before any update) then holds their state too."""
        build_optimizers(self)



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
    except Exception:  # a scale nanguard cannot read: unknown
        log.debug("nanguard: cannot read the loss scale", exc_info=True)
        return None
    return v if math.isfinite(v) else None
