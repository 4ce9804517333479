"""Dispatch modes without dynamo's wrapper while nothing in the process was compiled.

PyTorch wraps the ``__torch_dispatch__`` of every ``TorchDispatchMode`` subclass in
``torch._disable_dynamo``, so that the code a ``torch.compile`` runs never traces into a mode's
Python. The wrapper costs ~4 µs on every op that passes through the mode (the tape's ~19 ops a
step of a tiny logistic regression: ~75 µs of its ~770, docs/overhead.md), and its first call imports
``torch._dynamo`` (sympy, the DTensor op tables: 1.2 s with warm ``.pyc`` caches on a 2-core
CPU, 4 s without) in a script that never imported it.

Dynamo only runs a frame under a compiled context, and every such context — ``torch.compile``,
``torch._dynamo.optimize``, ``torch.export`` — registers its backend in
``torch._dynamo.eval_frame.cached_backends`` when it is made (the ``None`` there is
``torch._disable_dynamo``'s own: an optimizer's constructor loads dynamo for it, and compiles
nothing). :class:`LightMode` subclasses are not wrapped. Each time one is pushed, it becomes its
class's wrapped twin in place — what PyTorch would have made — once something was compiled
(:func:`compiled`), or when nothing would tell it of a ``torch.compile`` to come: while a step
recorder is registered or a locator is open (:func:`watching`), ``torch.compile`` is patched to
turn every light mode on the stack into its twin before the script can call what it compiled
(:func:`now_compiling`).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from ..core.patches import PatchSet
from ..core.transparent import transparent

__all__ = ["LightMode", "compiled", "now_compiling", "watching"]

_TWINS: dict[type, type] = {}
#: how many step recorders and open locators watch for ``torch.compile`` (patched while any does)
_watchers = 0
_COMPILE = PatchSet("light dispatch modes: torch.compile")
_compiled = False  # something was compiled (sticky: see :func:`compiled`)


def compiled() -> bool:
    """Was anything compiled in this process (a compiled context made: see the module
    docstring)? A torch whose dynamo keeps no such table is taken to have compiled. Once true,
    true for good: ``torch._dynamo.reset()`` empties the table, but what was compiled before it
    can still be called (and compile again)."""
    global _compiled
    if _compiled:
        return True
    ef = sys.modules.get("torch._dynamo.eval_frame")
    if ef is None:
        return False
    backends = getattr(ef, "cached_backends", None)
    _compiled = not isinstance(backends, dict) or any(b is not None for b in backends.values())
    return _compiled


class LightMode(TorchDispatchMode):
    """A ``TorchDispatchMode`` wrapped against dynamo only once something was compiled, or when
    nothing watches for ``torch.compile`` (see the module docstring). Decided each time it is
    pushed; its ``__torch_dispatch__`` runs for every op while it is."""

    #: set on the wrapped twins
    _under_dynamo = False

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # read by TorchDispatchMode.__init_subclass__ as each subclass is made: only the twins
        return cls.__dict__.get("_under_dynamo", False) is True

    def __enter__(self) -> Any:
        if not self._under_dynamo and (not _watchers or compiled()):
            under_dynamo(self)
        return super().__enter__()


def twin(cls: type) -> type:
    """``cls`` with its dispatch wrapped by ``torch._disable_dynamo`` (made once per class)."""
    made = _TWINS.get(cls)
    if made is None:
        def __torch_dispatch__(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return cls.__torch_dispatch__(self, func, types, args, kwargs)  # type: ignore[attr-defined]

        made = type(f"{cls.__name__}UnderDynamo", (cls,),
                    {"__torch_dispatch__": __torch_dispatch__, "_under_dynamo": True,
                     "__module__": cls.__module__, "__qualname__": f"{cls.__qualname__}UnderDynamo"})
        _TWINS[cls] = made
    return made


def under_dynamo(mode: LightMode) -> None:
    """``mode`` becomes its wrapped twin in place (its state kept, on the stack or not)."""
    if not mode._under_dynamo:
        mode.__class__ = twin(type(mode))


def now_compiling() -> None:
    """``torch.compile`` was called: every light mode on the dispatch stack becomes its twin
    before the script can call what it compiled (one kept off the stack, the tape, becomes it
    when next pushed)."""
    for m in _get_current_dispatch_mode_stack():
        if isinstance(m, LightMode):
            under_dynamo(m)


def _compile_tells(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    @transparent
    def compile(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        now_compiling()
        return out

    return compile


def watching(on: bool) -> None:
    """A step recorder was registered or a locator opened (``on``), or one of them went:
    ``torch.compile`` is patched while any of them is there, put back after the last."""
    global _watchers
    if on:
        _watchers += 1
        if _watchers == 1:
            _COMPILE.patch(torch, "compile", _compile_tells(torch.compile))
    elif _watchers > 0:
        _watchers -= 1
        if _watchers == 0:
            _COMPILE.restore()
