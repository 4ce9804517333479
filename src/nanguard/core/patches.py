"""Every attribute nanguard replaces while something of its is attached, in one registry.

An adapter patches a framework function in place only through a :class:`PatchSet` (one per
group of patches that come and go together: the step recorder's, the guard's, the module-call
wrapper, the backward wrapper, ``warnings.warn``). :meth:`PatchSet.restore` puts back every
original, in reverse order, runs the undo callables of changes that are no plain attribute (a
TorchScript builtin registered) and drops the caches that were only valid while patched.
:func:`left_patched` names whatever is still in place — after the last guard detached it must be
nothing (``tests/test_patches.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = ["Patch", "PatchSet", "left_patched"]

_lock = threading.Lock()
_SETS: list[PatchSet] = []


class Patch(NamedTuple):
    owner: Any
    name: str
    original: Any
    replacement: Any

    def describe(self) -> str:
        owner = getattr(self.owner, "__qualname__", None) or getattr(self.owner, "__name__", repr(self.owner))
        return f"{getattr(self.owner, '__module__', '')}.{owner}.{self.name}".lstrip(".")


class PatchSet:
    """Attributes replaced together, and how to undo them (see the module docstring)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._patches: list[Patch] = []
        self._undo: list[tuple[str, Callable[[], None]]] = []
        self._caches: list[Callable[[], None]] = []
        with _lock:
            _SETS.append(self)

    def patch(self, owner: Any, name: str, replacement: Any) -> Any:
        """Put ``replacement`` in place of ``owner.name``; the original is returned (and kept).
        The original is read from the owner's own ``__dict__`` (a class's, not an inherited one)."""
        d = getattr(owner, "__dict__", {})
        original = d[name] if name in d else getattr(owner, name)
        setattr(owner, name, replacement)
        self._patches.append(Patch(owner, name, original, replacement))
        return original

    def on_restore(self, what: str, undo: Callable[[], None]) -> None:
        """A change that is no plain attribute (a registration in a framework's table): ``undo``
        takes it back at :meth:`restore`."""
        self._undo.append((what, undo))

    def cache(self, clear: Callable[[], None]) -> None:
        """A cache valid only while patched (module names, step counts): cleared at restore."""
        self._caches.append(clear)

    def restore(self) -> None:
        """Every original back, newest first; every undo run; every cache dropped."""
        while self._patches:
            p = self._patches.pop()
            setattr(p.owner, p.name, p.original)
        while self._undo:
            self._undo.pop()[1]()
        for clear in self._caches:
            clear()

    def forget(self) -> None:
        """Leave the patches in place but stop tracking them: something else wrapped our
        replacement since, and putting the original back would drop that wrapper too."""
        self._patches.clear()

    @property
    def active(self) -> bool:
        return bool(self._patches or self._undo)

    def describe(self) -> list[str]:
        return [f"{self.name}: {p.describe()}" for p in self._patches] + [
            f"{self.name}: {what}" for what, _ in self._undo]


def left_patched() -> list[str]:
    """Every patch of every set still in place (nothing, once no guard is attached)."""
    with _lock:
        sets = list(_SETS)
    return [line for s in sets for line in s.describe()]
