"""Where a custom ``torch.autograd.Function`` runs its own code, for the hazard look.

A custom Function's ``forward`` runs with grad disabled (``Function.apply`` turns it off), and its
``backward`` inside the autograd engine, also without grad: to a dispatch mode, both look like an
evaluation or a metric, which the hazard look leaves aside (nothing there reaches the loss).
Yet a forward written naively (``log1p(exp(x))``) makes the model's output, and a backward
written naively (``exp(s) / exp(s).sum()``) makes its gradient. While a hazard look is on,
``Function.apply`` (when grad is enabled and an argument requires grad: the Function joins the
graph) and ``BackwardCFunction.apply`` (the engine's call of the user's ``backward``) are wrapped
to say so: :func:`current` is ``("forward" | "backward", the Function's class)`` inside them,
per thread (the engine may run a backward on its own threads). Restored when the last look
ends (:func:`leave`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch.autograd import function as _function

from ..core.patches import PatchSet

__all__ = ["Region", "current", "enter", "leave"]

#: (phase, the custom Function's class)
Region = tuple[str, type]

_local = threading.local()
_PATCHES = PatchSet("the custom-Function regions")
_users = 0
_lock = threading.Lock()


def _stack() -> list[Region]:
    s: list[Region] | None = getattr(_local, "stack", None)
    if s is None:
        s = _local.stack = []
    return s


def current() -> Region | None:
    """The innermost custom Function's code running now on this thread, or ``None``."""
    s = getattr(_local, "stack", None)
    return s[-1] if s else None


def _joins_graph(args: tuple[Any, ...]) -> bool:
    return torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)


def _forward(orig: Callable[..., Any]) -> Any:
    @functools.wraps(orig)
    def apply(cls: type, *args: Any, **kwargs: Any) -> Any:
        if not _joins_graph(args):
            return orig(cls, *args, **kwargs)
        s = _stack()
        s.append(("forward", cls))
        try:
            return orig(cls, *args, **kwargs)
        finally:
            s.pop()

    return classmethod(apply)


def _backward(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def apply(self: Any, *args: Any) -> Any:
        s = _stack()
        s.append(("backward", getattr(self, "_forward_cls", type(self))))
        try:
            return orig(self, *args)
        finally:
            s.pop()

    return apply


def enter() -> None:
    """A hazard look starts: the wrappers go in (once, however many looks are on)."""
    global _users
    with _lock:
        _users += 1
        if _users > 1:
            return
        fwd = _function.Function.__dict__["apply"].__func__
        _PATCHES.patch(_function.Function, "apply", _forward(fwd))
        for name in ("apply", "apply_boxed"):
            if name in _function.BackwardCFunction.__dict__:
                _PATCHES.patch(_function.BackwardCFunction, name,
                               _backward(_function.BackwardCFunction.__dict__[name]))


def leave() -> None:
    """A hazard look ends: the last one puts torch's methods back."""
    global _users
    with _lock:
        if _users == 0:
            return
        _users -= 1
        if _users == 0:
            _PATCHES.restore()
