"""Dispatch modes without dynamo's wrapper while nothing in the process was compiled.

PyTorch wraps the ``__torch_dispatch__`` of every ``TorchDispatchMode`` subclass in
``torch._disable_dynamo``, so that the code a ``torch.compile`` runs never traces into a mode's
Python. The wrapper costs ~5 µs on every op that passes through the mode (the tape's ~19 ops a
step of a tiny logistic regression: 110 µs of its ~760), and its first call imports
``torch._dynamo`` (sympy, the DTensor op tables: 1.2 s with warm ``.pyc`` caches on a 2-core
CPU, 4 s without) in a script that never imported it.

Dynamo only runs a frame under a compiled context, and every such context — ``torch.compile``,
``torch._dynamo.optimize``, ``torch.export`` — registers its backend in
``torch._dynamo.eval_frame.cached_backends`` when it is made (the ``None`` there is
``torch._disable_dynamo``'s own: an optimizer's constructor loads dynamo for it, and compiles
nothing). :class:`LightMode` subclasses are not wrapped; an instance made once something was
compiled (:func:`compiled`) is of the class's wrapped twin, as PyTorch would have made it. A
light mode on the stack, or kept to be pushed again (the step recorder's tape), when
``torch.compile`` is called becomes its twin in place (:func:`now_compiling`: ``torch.compile`` is
patched while a step recorder is registered, and the recorder checks before each push); every
light mode is made and pushed only while a guard is attached.
"""

from __future__ import annotations

import sys
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

__all__ = ["LightMode", "compiled", "now_compiling", "under_dynamo"]

_TWINS: dict[type, type] = {}


def compiled() -> bool:
    """Was anything compiled in this process (a compiled context made: see the module
    docstring)? A torch whose dynamo keeps no such table is taken to have compiled."""
    ef = sys.modules.get("torch._dynamo.eval_frame")
    if ef is None:
        return False
    backends = getattr(ef, "cached_backends", None)
    if not isinstance(backends, dict):
        return True
    return any(b is not None for b in backends.values())


class LightMode(TorchDispatchMode):
    """A ``TorchDispatchMode`` whose dispatch is wrapped against dynamo only once something was
    compiled (see the module docstring). Its ``__torch_dispatch__`` runs for every op while it
    is pushed."""

    #: set on the wrapped twins
    _under_dynamo = False

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # read by TorchDispatchMode.__init_subclass__ as each subclass is made: only the twins
        return cls.__dict__.get("_under_dynamo", False) is True

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if not cls._under_dynamo and compiled():
            cls = twin(cls)
        return super().__new__(cls)


def twin(cls: type) -> type:
    """``cls`` with its dispatch wrapped by ``torch._disable_dynamo`` (made once per class)."""
    made = _TWINS.get(cls)
    if made is None:
        base = cls

        def __torch_dispatch__(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return base.__torch_dispatch__(self, func, types, args, kwargs)  # type: ignore[attr-defined]

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
    before the script can call what it compiled."""
    for m in _get_current_dispatch_mode_stack():
        if isinstance(m, LightMode):
            under_dynamo(m)
