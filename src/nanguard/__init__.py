"""nanguard: catch the first NaN/Inf of a training run at the op that made it.

The public surface is small::

    import nanguard

    with nanguard.locate(model):         # trace: raise at the op that made the NaN
        ...

    guard = nanguard.attach(model, optimizer)   # watch + replay, on every step
    with nanguard.check(steps=50) as hz:  # latent hazards: unsafe ops and their margins
        ...

    nanguard.register_op_traits("mylib::safe_log", safe=True)   # what a custom op can do
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._version import __version__
from .core import Cause, Diagnosis, Finding, GiveUpError, NonFiniteError, diagnose
from .core.ops import OpTraits, register_op_traits

if TYPE_CHECKING:
    from .datascan import scan
    from .torch import locate
    from .torch.guard import Guard, attach
    from .torch.hazards import check

__all__ = [
    "Cause",
    "Diagnosis",
    "Finding",
    "GiveUpError",
    "Guard",
    "NonFiniteError",
    "OpTraits",
    "__version__",
    "attach",
    "check",
    "diagnose",
    "locate",
    "register_op_traits",
    "scan",
]


def __getattr__(name: str) -> Any:
    # torch is imported only when a torch entry point is used, so Keras users need no torch
    if name == "locate":
        from .torch import locate

        return locate
    if name == "check":
        from .torch.hazards import check
        return check
    if name in ("attach", "Guard"):
        from .torch import guard

        return getattr(guard, name)
    if name == "scan":  # numpy only; pyarrow / torch when the data needs them
        from .datascan import scan

        return scan
    raise AttributeError(f"module 'nanguard' has no attribute {name!r}")
