"""``nanguard run`` for Keras / TensorFlow: one global guard for a script nanguard did not write.

Installed as soon as the script has imported TensorFlow and Keras. Without touching the script:

* ``keras.Model.fit`` gets a :class:`~nanguard.keras.NanGuard` callback (unless it has one);
* every Keras optimizer that updates weights is adopted by the session's guard: its update is
  checked and made conditional inside the traced step (``watch.guarded_apply``);
* a ``tf.function`` whose trace contains such an update is a training step: after each call the
  guard reads the check and, on a non-finite value, replays the call eagerly on the same
  arguments; an update run eagerly is checked right after it (without a replay).

``trace=True`` (``--trace``) runs every ``tf.function`` eagerly under the locator for the whole
run: slow, exact, and the only way to name an op inside the optimizer's update.
"""

from __future__ import annotations

import inspect
from typing import Any

from ..core.errors import NonFiniteError
from ..core.session import GuardSession
from . import _patches
from ._compat import keras, tf
from .callback import NanGuard
from .guard import KerasGuard
from .locate import Locator
from .replay import replay_of

__all__ = ["KerasSession"]

_MISSING = object()


class KerasSession(GuardSession):
    """The Keras side of a ``nanguard run``."""

    framework = "keras"

    def __init__(self, policy: str = "raise", trace: bool = False, **guard_kwargs: Any) -> None:
        self.guard = KerasGuard(None, None, policy=policy, **guard_kwargs)
        self.trace = trace
        self.notes: list[str] = []
        self._locator: Locator | None = None
        self._eager_before: bool | None = None
        self._own_fit: Any = _MISSING
        self._installed = False

    # --- lifecycle ---------------------------------------------------------------------------
    def install(self) -> None:
        if self._installed:
            return
        self.guard.install()
        _patches.add_adopter(self._adopt)
        _patches.FUNCTION_HOOK = self._function_step
        self._patch_fit()
        if self.trace:
            self.guard.replay_enabled = False
            self._eager_before = tf.config.functions_run_eagerly()
            tf.config.run_functions_eagerly(True)
            self._locator = Locator(on_sink="raise", step=self.guard.step, detected_by="trace")
            self._locator.__enter__()
            self.guard.on_step_end.append(self._sync_step)
            self.notes.append("--trace: every tf.function ran eagerly under the locator")
        self._installed = True

    def uninstall(self) -> None:
        if not self._installed:
            return
        self._installed = False
        if self._locator is not None:
            self._locator.__exit__(None, None, None)
            self._locator = None
        if self._eager_before is not None:
            tf.config.run_functions_eagerly(self._eager_before)
            self._eager_before = None
        self._unpatch_fit()
        if self._function_step == _patches.FUNCTION_HOOK:
            _patches.FUNCTION_HOOK = None
        _patches.remove_adopter(self._adopt)
        self.guard.detach()
        self.notes.extend(self.uninstall_notes())

    def uninstall_notes(self) -> list[str]:
        """Notes for the run log (the guarantee check under ``NANGUARD_VERIFY=1``)."""
        return [] if self.guard.policy == "raise" else self.verify_notes()

    # --- adoption, steps ----------------------------------------------------------------------
    def _adopt(self, optimizer: Any) -> bool:
        if not self._installed:
            return False
        self.guard.adopt(optimizer)
        return True

    def _function_step(self, fn: Any, call: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        out = call()
        if self.guard.is_step_function(fn):
            py = getattr(fn, "python_function", None)
            self.guard.after_step(replay_of(py, args, kwargs) if py is not None else None)
        return out

    def _sync_step(self) -> None:
        if self._locator is not None:
            self._locator.step = self.guard.step  # the tracer counts steps as the guard does

    def _patch_fit(self) -> None:
        model_cls = keras.Model
        self._own_fit = model_cls.__dict__.get("fit", _MISSING)
        orig = model_cls.fit
        session = self
        sig = inspect.signature(orig)

        def fit(model: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                bound = sig.bind(model, *args, **kwargs)
            except TypeError:
                return orig(model, *args, **kwargs)
            session.guard.fit_started(bound.arguments)
            cbs = bound.arguments.get("callbacks")
            guard_cb = NanGuard(guard=session.guard)
            if cbs is None:
                bound.arguments["callbacks"] = [guard_cb]
            elif isinstance(cbs, keras.callbacks.CallbackList):
                if not any(isinstance(c, NanGuard) for c in cbs.callbacks):
                    cbs.append(guard_cb)
                    guard_cb.set_model(model)
            elif not any(isinstance(c, NanGuard) for c in cbs):
                bound.arguments["callbacks"] = [*list(cbs), guard_cb]
            return orig(*bound.args, **bound.kwargs)

        fit.__doc__ = orig.__doc__
        fit.__wrapped__ = orig  # type: ignore[attr-defined]
        model_cls.fit = fit

    def _unpatch_fit(self) -> None:
        if self._own_fit is _MISSING:
            if "fit" in keras.Model.__dict__:
                del keras.Model.fit
        else:
            keras.Model.fit = self._own_fit

    # --- results (steps, history, events, recoveries, complete: GuardSession) ---------------------

    def explain_crash(self, exc: BaseException) -> NonFiniteError | None:
        """The script raised something else: was a non-finite value the guard met the reason?

        Only when the error speaks of NaN/Inf and the guard met a non-finite value in the
        step that just ran (under ``skip``/``recover`` the script may carry on with NaN outputs)."""
        text = f"{type(exc).__name__}: {exc}".lower()
        if not any(w in text for w in ("nan", "inf", "finite", "overflow")):
            return None
        if not self.guard.findings:
            return None
        f, d = self.guard.findings[-1]
        if f.step is None or f.step < self.guard.step - 1:
            return None
        return NonFiniteError(f, d)
