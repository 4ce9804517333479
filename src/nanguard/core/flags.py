"""The command-line flag a value of the run came from (``--lr 1000``), so advice can say it in
the script's own terms: a learning rate or a weight decay set by a flag is changed on the command
line, not by rewriting the optimizer line. Read at diagnosis only, from the arguments the script
was given."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Flag", "lr_flag", "wd_flag"]

#: a flag names a learning rate when it says so (``--learning-rate``, ``--base_learning_rate``)
#: or one of its words is ``lr`` (``--lr``, ``--base-lr``, ``--max_lr``, ``--lr0``)
_LR_PHRASES = ("learning-rate", "learningrate")
#: … a weight decay likewise (``--weight-decay``, ``--trainer.weight_decay``, ``--wd``)
_WD_PHRASES = ("weight-decay", "weightdecay")


@dataclass(frozen=True)
class Flag:
    """A flag as the user typed it: ``--lr 5`` (``sep`` a space) or ``--trainer.lr=5``
    (``sep`` ``=``: some parsers accept only that form, so the advice keeps it)."""

    name: str
    text: str
    sep: str = " "

    @property
    def value(self) -> float:
        return float(self.text)

    def typed(self, text: str | None = None) -> str:
        """The flag with ``text`` (default: its own value), in the form the user typed."""
        return f"{self.name}{self.sep}{self.text if text is None else text}"


def _number(text: str) -> float | None:
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _words(name: str) -> tuple[str, list[str]]:
    words = name.lower().lstrip("-").replace("_", "-").replace(".", "-")
    return words, words.split("-")


#: a flag that counts something is no learning rate (``--lr_decay_iters=500``, ``--lr-warmup-steps``)
_COUNTS = frozenset({"iter", "iters", "iteration", "iterations", "step", "steps", "epoch", "epochs",
                     "patience", "every", "freq", "interval"})


def _is_lr_flag(name: str) -> bool:
    words, parts = _words(name)
    if _COUNTS.intersection(parts):
        return False
    return (any(p in words for p in _LR_PHRASES)
            or any(w == "lr" or (w.startswith("lr") and w[2:].isdigit()) for w in parts))


def _is_wd_flag(name: str) -> bool:
    words, parts = _words(name)
    return any(p in words for p in _WD_PHRASES) or "wd" in parts


def _flags(argv: Sequence[str], named: Callable[[str], bool]) -> list[tuple[Flag, float]]:
    """Every flag ``named`` accepts, with its numeric value, in order."""
    out: list[tuple[Flag, float]] = []
    for i, arg in enumerate(argv):
        if not arg.startswith("-"):
            continue
        name, eq, text = arg.partition("=")
        if not eq:
            if i + 1 >= len(argv):
                continue
            text = argv[i + 1]
        if not named(name):
            continue
        v = _number(text)
        if v is not None:
            out.append((Flag(name, text, "=" if eq else " "), v))
    return out


def lr_flag(lr: float | None, argv: Sequence[str], top: float | None = None) -> Flag | None:
    """The flag among ``argv`` (the script's arguments) whose value is the learning rate ``lr``
    (to 1e-6 relative); else, with ``top`` (the highest learning rate the run reached under a
    schedule that moves it: warmup, decay, annealing), the one flag whose value is at least
    ``top`` — the schedule scales it. ``None`` when no flag gave it."""
    if not lr or not argv:
        return None
    found = _flags(argv, _is_lr_flag)
    exact = next((f for f, v in found if math.isclose(v, lr, rel_tol=1e-6)), None)
    if exact is not None or top is None:
        return exact
    above = [f for f, v in found if v >= top * (1 - 1e-6)]
    return above[0] if len(above) == 1 else None


def wd_flag(wd: float | None, argv: Sequence[str]) -> Flag | None:
    """The flag among ``argv`` whose value is the weight decay ``wd``; ``None`` when none."""
    if not wd or not argv:
        return None
    return next((f for f, v in _flags(argv, _is_wd_flag) if math.isclose(v, wd, rel_tol=1e-6)), None)
