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


def original_backward() -> Callable[..., Any]:
    """``torch.autograd.backward`` without nanguard's wrapper (a trial's backward on FSDP2)."""
    return _orig.get("backward", torch.autograd.backward)


_StepHook = Callable[[torch.optim.Optimizer, tuple[Any, ...], dict[str, Any]], Any]


class _Listener:
    __slots__ = ("alive", "post", "pre")

    def __init__(self, pre: _StepHook, post: _StepHook) -> None:
        self.pre, self.post, self.alive = pre, post, True


class _OptimizerHooks:
    """One global pre-step and one post-step hook registered with torch, calling nanguard's
    listeners in the order they were added. Torch iterates its hook dicts while it calls them:
    a listener added or removed from inside one (a replay's tracer opened and closed in the
    guard's post-step hook, a forward-only check ended by the first step) must not change them,
    or torch raises ``OrderedDict mutated during iteration`` in the user's ``optimizer.step()``.
    Each call iterates a snapshot of the listeners; a removed one is skipped at once; torch's
    two hooks go only when the last listener does, outside any hook of ours."""

    listeners: ClassVar[list[_Listener]] = []
    handles: ClassVar[tuple[Any, Any] | None] = None
    depth: ClassVar[int] = 0

    @classmethod
    def pre(cls, opt: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        changed: tuple[tuple[Any, ...], dict[str, Any]] | None = None
        cls.depth += 1
        try:
            for ls in tuple(cls.listeners):
                if ls.alive:
                    out = ls.pre(opt, args, kwargs)
                    if out is not None:  # torch's protocol: new (args, kwargs) for the step
                        args, kwargs = changed = out
        finally:
            cls.depth -= 1
        return changed

    @classmethod
    def post(cls, opt: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        cls.depth += 1
        try:
            for ls in tuple(cls.listeners):
                if ls.alive:
                    ls.post(opt, args, kwargs)
        finally:
            cls.depth -= 1

    @classmethod
    def add(cls, ls: _Listener) -> None:
        cls.listeners.append(ls)
        if cls.handles is None:
            cls.handles = (_optim.register_optimizer_step_pre_hook(cls.pre),
                           _optim.register_optimizer_step_post_hook(cls.post))

    @classmethod
    def remove(cls, ls: _Listener) -> None:
        ls.alive = False
        if ls in cls.listeners:
            cls.listeners.remove(ls)
        if not cls.listeners and cls.handles is not None and not cls.depth:
            for h in cls.handles:
                h.remove()
            cls.handles = None


def add_optimizer_listener(pre: _StepHook, post: _StepHook) -> _Handle:
    """Global optimizer step pre/post hooks (through torch's ``register_optimizer_step_*_hook``,
    see :class:`_OptimizerHooks`); the handle may be removed from inside any optimizer hook."""
    ls = _Listener(pre, post)
    _OptimizerHooks.add(ls)
    return _Handle(lambda: _OptimizerHooks.remove(ls))
