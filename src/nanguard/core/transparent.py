"""Wrapper frames that ``warnings.warn`` looks through.

An adapter wraps a few framework functions while a guard is active (``zero_grad``, DataLoader
iteration, ``GradScaler.__init__``/``step``, ``clip_grad_norm_``). The wrapper is one more frame
between the user's line and the framework's ``warnings.warn(..., stacklevel=2)``, so the warning
would name the wrapper's file instead of the line ``python script.py`` names.

Functions marked :func:`transparent` are skipped: while :func:`install` is in effect (counted:
one :func:`uninstall` per :func:`install`), ``warnings.warn`` is a thin function that raises the
caller's ``stacklevel`` by the number of transparent frames at the place it would attribute the
warning to, and then calls the original. Filters, ``once``/``default`` registries and
``catch_warnings`` behave as before (nothing else changes, nothing is caught and re-emitted).
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any, TypeVar

from .patches import PatchSet

__all__ = ["install", "thin_warn", "transparent", "uninstall"]

F = TypeVar("F", bound=Callable[..., Any])

_CODES: set[CodeType] = set()
_lock = threading.Lock()
_users = 0
_original: Callable[..., Any] | None = None


def transparent(fn: F) -> F:
    """Mark ``fn`` (a wrapper) as invisible to ``warnings.warn``'s ``stacklevel``."""
    _CODES.add(fn.__code__)
    return fn


def _warn(message: Any, category: Any = None, stacklevel: int = 1, source: Any = None,
          **kwargs: Any) -> None:
    original = _original or warnings.warn
    level = stacklevel if isinstance(stacklevel, int) else 1
    frame: FrameType | None = sys._getframe(1)  # the function that called warnings.warn
    for _ in range(level - 1):
        if frame is None:
            break
        frame = frame.f_back
    extra = 0
    while frame is not None and frame.f_code in _CODES:
        frame = frame.f_back
        extra += 1
    original(message, category, level + extra + 1, source, **kwargs)  # +1: this frame


def thin_warn() -> Callable[..., None]:
    """The function :func:`install` puts in place of ``warnings.warn`` (an adapter registers it
    where the framework looks ``warnings.warn`` up by identity: TorchScript's builtins)."""
    return _warn


_PATCHES = PatchSet("warnings.warn")


def install() -> None:
    global _users, _original
    with _lock:
        if _users == 0:
            _original = _PATCHES.patch(warnings, "warn", _warn)
        _users += 1


def uninstall() -> None:
    global _users, _original
    with _lock:
        if _users == 0:
            return
        _users -= 1
        if _users == 0 and _original is not None:
            if warnings.warn is _warn:
                _PATCHES.restore()
            else:  # someone wrapped warnings.warn after us: ours stays under theirs, still working
                _PATCHES.forget()
            _original = None
