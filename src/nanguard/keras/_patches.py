"""Class-level hooks into Keras and TensorFlow, installed while a guard or a locator needs them.

* ``BaseOptimizer.apply`` — every Keras optimizer's update (``apply_gradients`` calls it). A guarded
  optimizer's update goes through :func:`~nanguard.keras.watch.guarded_apply`; under a replay or
  ``locate()`` it is handed to the locator instead.
* ``tf.GradientTape.gradient`` — its target is the step's loss (recorded for the watch tier; a
  sink for the locator), its result the gradients (a sink for the locator).
* ``keras.layers.Layer.__call__`` and ``keras.losses.Loss.__call__`` — only used under a
  locator: the stack of running layers (and loss objects) gives each op its layer path
  (``sequential/dense_2``, ``compile_loss/mean_squared_error``).
* ``tf.function``'s ``__call__`` — only under ``nanguard run``: a traced step that contains a
  guarded update is a training step, handled after each call.

Hooks are global (the user's model and optimizer objects are never modified), reference-counted,
and removed when the last user goes.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ._compat import keras, tf
from .watch import GuardState, guarded_apply, record_loss

if TYPE_CHECKING:
    from .locate import Locator

__all__ = ["Owner", "adopt", "in_step", "install", "owner_of", "uninstall"]


class Owner(Protocol):
    """Who handles a guarded optimizer's steps (a :class:`~nanguard.keras.guard.KerasGuard`)."""

    def after_eager_apply(self, state: GuardState) -> None: ...
    def traced_in_function(self, fn: Any) -> None: ...


_lock = threading.RLock()
_users = 0
_originals: dict[str, Any] = {}
_registry: dict[int, tuple[weakref.ref[Any], GuardState, Owner]] = {}
_adopters: list[Callable[[Any], bool]] = []
_local = threading.local()
#: the active locator (replay or ``locate()``), if any
LOCATOR: Locator | None = None
#: a Function.__call__ handler installed by ``nanguard run`` (None otherwise)
FUNCTION_HOOK: Callable[[Any, Callable[[], Any], tuple[Any, ...], dict[str, Any]], Any] | None = None


def _base_optimizer() -> Any:
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    return BaseOptimizer


def _function_class() -> Any:
    from tensorflow.python.eager.polymorphic_function.polymorphic_function import Function

    return Function


# ----------------------------------------------------------------------------------------------
# registry of guarded optimizers


def adopt(optimizer: Any, state: GuardState, owner: Owner) -> None:
    with _lock:
        key = id(optimizer)
        _registry[key] = (weakref.ref(optimizer, functools.partial(_forget, key)), state, owner)


def _forget(key: int, _ref: Any) -> None:
    reg = globals().get("_registry")
    if isinstance(reg, dict):
        reg.pop(key, None)


def release(optimizer: Any) -> None:
    with _lock:
        _registry.pop(id(optimizer), None)


def registered_owner(optimizer: Any) -> Owner | None:
    """The owner an optimizer was explicitly adopted by (no adopter is asked)."""
    entry = _registry.get(id(optimizer))
    if entry is not None and entry[0]() is optimizer:
        return entry[2]
    return None


def owner_of(optimizer: Any) -> tuple[GuardState, Owner] | None:
    entry = _registry.get(id(optimizer))
    if entry is not None and entry[0]() is optimizer:
        return entry[1], entry[2]
    for adopter in list(_adopters):
        if adopter(optimizer):  # it adopted the optimizer (registered it here)
            entry = _registry.get(id(optimizer))
            if entry is not None:
                return entry[1], entry[2]
    return None


def add_adopter(fn: Callable[[Any], bool]) -> None:
    _adopters.append(fn)


def remove_adopter(fn: Callable[[Any], bool]) -> None:
    if fn in _adopters:
        _adopters.remove(fn)


# ----------------------------------------------------------------------------------------------
# "inside a step": the owner handles the step after it; nothing is handled per apply


class in_step:
    """Context manager: a step driver (the fit wrapper, ``guard.step``) is running a step."""

    def __enter__(self) -> None:
        _local.step_depth = getattr(_local, "step_depth", 0) + 1

    def __exit__(self, *exc: object) -> None:
        _local.step_depth = getattr(_local, "step_depth", 1) - 1


def step_depth() -> int:
    return int(getattr(_local, "step_depth", 0))


def function_stack() -> list[Any]:
    st: list[Any] | None = getattr(_local, "fn_stack", None)
    if st is None:
        st = _local.fn_stack = []
    return st


# ----------------------------------------------------------------------------------------------
# the wrappers


def _apply(self: Any, grads: Any, trainable_variables: Any = None) -> Any:
    orig = _originals["apply"]
    loc = LOCATOR
    if loc is not None and loc.intercepts_apply:
        return loc.on_apply(self, grads, trainable_variables, orig)
    found = owner_of(self)
    if found is None:
        if loc is not None:  # locate(): the update is the optimizer phase, its writes are sinks
            return _observed(loc, orig)(self, grads, trainable_variables)
        return orig(self, grads, trainable_variables)
    state, owner = found
    if loc is not None:
        with loc.quiet():
            res = guarded_apply(state, _observed(loc, orig), self, grads, trainable_variables)
    else:
        res = guarded_apply(state, orig, self, grads, trainable_variables)
    stack = function_stack()
    if step_depth():
        pass  # a step driver (NanGuard, guard.wrap) checks the step after it
    elif stack:
        owner.traced_in_function(stack[0])  # a tf.function step: checked after each call
    elif tf.executing_eagerly():
        owner.after_eager_apply(state)  # an eager loop: checked right now, without a replay
    return res


def _observed(loc: Locator, orig: Callable[..., Any]) -> Callable[..., Any]:
    """The optimizer's own update, seen by the locator (its ops are the optimizer phase)."""

    def run(opt: Any, grads: Any, tv: Any) -> Any:
        with loc.loud(), loc.optimizer_phase(opt):
            return orig(opt, grads, tv)

    return run


def _gradient(self: Any, target: Any, sources: Any, *args: Any, **kwargs: Any) -> Any:
    orig = _originals["gradient"]
    loc = LOCATOR
    if loc is None:
        record_loss(target)
        return orig(self, target, sources, *args, **kwargs)
    loc.on_gradient_start(target)
    record_loss(target)
    try:
        grads = orig(self, target, sources, *args, **kwargs)
    except BaseException:
        loc.on_gradient_abort()
        raise
    loc.on_gradient_end(grads, sources)
    return grads


def _layer_call(self: Any, *args: Any, **kwargs: Any) -> Any:
    orig = _originals["layer_call"]
    loc = LOCATOR
    if loc is None:
        return orig(self, *args, **kwargs)
    loc.enter_layer(self)
    try:
        out = orig(self, *args, **kwargs)
    finally:
        loc.exit_layer(self)
    loc.layer_output(self, out)
    return out


def _loss_call(self: Any, *args: Any, **kwargs: Any) -> Any:
    """A Keras loss object: its ops are placed in it (``compile_loss/mean_squared_error``)."""
    orig = _originals["loss_call"]
    loc = LOCATOR
    if loc is None:
        return orig(self, *args, **kwargs)
    loc.enter_layer(self)
    try:
        return orig(self, *args, **kwargs)
    finally:
        loc.exit_layer(self)


def _function_call(self: Any, *args: Any, **kwargs: Any) -> Any:
    orig = _originals["function_call"]
    hook = FUNCTION_HOOK
    stack = function_stack()
    if hook is None or stack or step_depth():
        stack.append(self)
        try:
            return orig(self, *args, **kwargs)
        finally:
            stack.pop()

    def call() -> Any:
        stack.append(self)
        try:
            return orig(self, *args, **kwargs)
        finally:
            stack.pop()

    return hook(self, call, args, kwargs)


# ----------------------------------------------------------------------------------------------
# install / uninstall


def install() -> None:
    """Patch (first user) or count one more user."""
    global _users
    with _lock:
        _users += 1
        if _users > 1:
            return
        base = _base_optimizer()
        _originals["apply"] = base.__dict__["apply"]
        base.apply = _apply
        _originals["gradient"] = tf.GradientTape.__dict__["gradient"]
        tf.GradientTape.gradient = _gradient
        layer = keras.layers.Layer
        _originals["layer_call"] = layer.__dict__["__call__"]
        layer.__call__ = _layer_call
        fn_cls = _function_class()
        _originals["function_call"] = fn_cls.__dict__["__call__"]
        fn_cls.__call__ = _function_call
        loss_cls = keras.losses.Loss
        _originals["loss_call"] = loss_cls.__dict__["__call__"]
        loss_cls.__call__ = _loss_call


def uninstall() -> None:
    """One user less; the last one puts every original back."""
    global _users
    with _lock:
        if _users == 0:
            return
        _users -= 1
        if _users:
            return
        _base_optimizer().apply = _originals.pop("apply")
        tf.GradientTape.gradient = _originals.pop("gradient")
        keras.layers.Layer.__call__ = _originals.pop("layer_call")
        _function_class().__call__ = _originals.pop("function_call")
        keras.losses.Loss.__call__ = _originals.pop("loss_call")


class installed:
    """``with installed():`` — the hooks, for the duration (a replay, ``locate()``)."""

    def __enter__(self) -> None:
        install()

    def __exit__(self, *exc: object) -> None:
        uninstall()
