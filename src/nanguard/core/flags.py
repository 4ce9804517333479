"""The command-line flag a value of the run came from (``--lr 1000``), so advice can say it in
the script's own terms: a learning rate set by a flag is changed on the command line, not by
rewriting the optimizer line. Read at diagnosis only, from the arguments the script was given."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["lr_flag"]

#: a flag names a learning rate when it says so (``--learning-rate``, ``--base_learning_rate``)
#: or one of its words is ``lr`` (``--lr``, ``--base-lr``, ``--max_lr``, ``--lr0``)
_LR_PHRASES = ("learning-rate", "learningrate")


def _number(text: str) -> float | None:
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _is_lr_flag(name: str) -> bool:
    words = name.lower().lstrip("-").replace("_", "-")
    return (any(p in words for p in _LR_PHRASES)
            or any(w == "lr" or (w.startswith("lr") and w[2:].isdigit()) for w in words.split("-")))


def lr_flag(lr: float | None, argv: Sequence[str]) -> tuple[str, str] | None:
    """``("--lr", "1000")``: the flag among ``argv`` (the script's arguments) whose value is the
    learning rate ``lr`` (to 1e-6 relative), as typed; ``None`` when no flag gave it."""
    if not lr or not argv:
        return None
    for i, arg in enumerate(argv):
        if not arg.startswith("-"):
            continue
        name, eq, text = arg.partition("=")
        if not eq:
            if i + 1 >= len(argv):
                continue
            text = argv[i + 1]
        if not _is_lr_flag(name):
            continue
        v = _number(text)
        if v is not None and math.isclose(v, lr, rel_tol=1e-6):
            return name, text
    return None
