"""Hooks around ``torch.autograd.backward`` / ``torch.autograd.grad`` and optimizer steps.

``Tensor.backward`` calls ``torch.autograd.backward`` through the module attribute, so one wrapper
sees every backward pass with its root tensors (the loss) before the engine runs, and again after.
The wrapper is installed while at least one listener is registered and removed with the last one.
Optimizer steps are observed with torch's own global optimizer hooks.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
import torch.optim.optimizer as _optim

from ..core.patches import PatchSet

__all__ = ["BackwardListener", "add_backward_listener", "add_optimizer_listener"]


class BackwardListener:
    """Called around each backward pass (``kind`` is ``"backward"`` or ``"grad"``).

    ``before(kind, roots, grads, inputs)`` runs before the engine, ``after(kind, roots, inputs,
    result)`` after it returned (``result`` is what ``autograd.grad`` returned, else ``None``).
    """

    def before(
        self,
        kind: str,
        roots: Sequence[torch.Tensor],
        grads: Sequence[torch.Tensor | None],
        inputs: Sequence[torch.Tensor] | None,
    ) -> None:
        pass

    def after(
        self,
        kind: str,
        roots: Sequence[torch.Tensor],
        inputs: Sequence[torch.Tensor] | None,
        result: Any,
    ) -> None:
        pass


_listeners: list[BackwardListener] = []
_lock = threading.Lock()
_orig: dict[str, Callable[..., Any]] = {}
_local = threading.local()


def _as_list(x: Any) -> list[Any]:
    if x is None:
        return []
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return list(x)
    return [x]


def _make_wrapper(kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(_local, "busy", False) or not _listeners:
            return fn(tensors, *args, **kwargs)
        roots = _as_list(tensors)
        if kind == "backward":
            grads = _as_list(kwargs.get("grad_tensors", args[0] if args else None))
            inputs = kwargs.get("inputs", args[4] if len(args) > 4 else None)
        else:
            inputs = kwargs.get("inputs", args[0] if args else None)
            grads = _as_list(kwargs.get("grad_outputs", args[1] if len(args) > 1 else None))
        inputs_l = _as_list(inputs) if inputs is not None else None
        listeners = list(_listeners)
        _local.busy = True
        try:
            for lis in listeners:
                lis.before(kind, roots, grads, inputs_l)
        finally:
            _local.busy = False
        result = fn(tensors, *args, **kwargs)
        _local.busy = True
        try:
            # last registered, first to see the result (as nested context managers exit): a
            # tracer added on top of a guard names the origin before the guard's check fires
            for lis in reversed(listeners):
                lis.after(kind, roots, inputs_l, result)
        finally:
            _local.busy = False
        return result

    wrapper.__nanguard_wrapped__ = fn  # type: ignore[attr-defined]
    return wrapper


_PATCHES = PatchSet("the backward wrapper")


def _install() -> None:
    if _orig:
        return
    for name in ("backward", "grad"):
        _orig[name] = getattr(torch.autograd, name)
        _PATCHES.patch(torch.autograd, name, _make_wrapper(name, _orig[name]))


def _uninstall() -> None:
    if not _orig:
        return
    _PATCHES.restore()
    _orig.clear()


class _Handle:
    def __init__(self, remove: Callable[[], None]) -> None:
        self._remove: Callable[[], None] | None = remove

    def remove(self) -> None:
        if self._remove is not None:
            self._remove()
            self._remove = None


def add_backward_listener(listener: BackwardListener) -> _Handle:
    """Register ``listener`` around every backward pass; ``.remove()`` the returned handle."""
    with _lock:
        _listeners.append(listener)
        _install()

    def remove() -> None:
        with _lock:
            if listener in _listeners:
                _listeners.remove(listener)
            if not _listeners:
                _uninstall()

    return _Handle(remove)


def original_grad() -> Callable[..., Any]:
    """``torch.autograd.grad`` without nanguard's wrapper (for the replay's own backward)."""
    return _orig.get("grad", torch.autograd.grad)


class _OptimizerHooks:
    """Which optimizer-hook calls of ours are running, and the removals they asked for: torch
    iterates its hook dicts while it calls them, so a hook that removes one (a forward-only check
    ended by the first step's post-hook closes the tracer's listener) would make torch raise
    ``OrderedDict mutated during iteration`` in the user's ``optimizer.step()``. Such a removal
    leaves the hook registered and silent until the next removal or registration outside a hook."""

    depth: ClassVar[int] = 0
    removals: ClassVar[list[Callable[[], None]]] = []

    @classmethod
    def flush(cls) -> None:
        if cls.depth:
            return
        while cls.removals:
            cls.removals.pop()()


def add_optimizer_listener(
    pre: Callable[[torch.optim.Optimizer, tuple[Any, ...], dict[str, Any]], Any],
    post: Callable[[torch.optim.Optimizer, tuple[Any, ...], dict[str, Any]], None],
) -> _Handle:
    """Global optimizer step pre/post hooks (torch's own ``register_optimizer_step_*_hook``).
    The handle may be removed from inside any optimizer hook (see :class:`_OptimizerHooks`)."""
    hooks = _OptimizerHooks
    hooks.flush()
    alive = [True]

    def call(fn: Callable[..., Any], opt: torch.optim.Optimizer, args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> Any:
        if not alive[0]:
            return None
        hooks.depth += 1
        try:
            return fn(opt, args, kwargs)
        finally:
            hooks.depth -= 1

    h1 = _optim.register_optimizer_step_pre_hook(lambda o, a, k: call(pre, o, a, k))
    h2 = _optim.register_optimizer_step_post_hook(lambda o, a, k: call(post, o, a, k))

    def remove() -> None:
        alive[0] = False
        hooks.removals.append(h1.remove)
        hooks.removals.append(h2.remove)
        hooks.flush()

    return _Handle(remove)
