"""How far the failing Keras step's data is from unit scale (read once, at a diagnosis).

The failing step's batch — ``x`` and ``y`` of ``fit``'s ``(x, y, sample_weight)``, as the replay
names them — is read as NumPy; the loss the model was compiled with names a regression loss.
Best-effort: what cannot be read is left out.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.case import DataScale

__all__ = ["data_scale"]

log = logging.getLogger("nanguard")

_REGRESSION = {"mse", "mean_squared_error", "mae", "mean_absolute_error", "huber", "huber_loss", "log_cosh",
               "meansquarederror", "meanabsoluteerror", "logcosh"}


def regression_loss(model: Any) -> str | None:
    """The model's compiled loss, when it is a regression loss (``"mse"``, ``MeanSquaredError``)."""
    loss = getattr(model, "loss", None)
    name = loss if isinstance(loss, str) else getattr(loss, "__name__", None) or type(loss).__name__
    return name if isinstance(name, str) and name.lower() in _REGRESSION else None


def _floats(batch: Sequence[tuple[str, Any]], prefix: str) -> list[np.ndarray]:
    out = []
    for name, t in batch:
        if name.startswith(prefix):
            a = np.asarray(t.numpy() if hasattr(t, "numpy") else t)
            if a.dtype.kind == "f" and a.size:
                out.append(a)
    return out


def _spread(xs: list[np.ndarray]) -> float | None:
    best = None
    for a in xs:
        if a.ndim != 2 or a.shape[1] < 2:
            continue
        cols = np.abs(a).max(0)
        cols = cols[cols > 0]
        if cols.size >= 2:
            r = float(cols.max() / cols.min())
            best = r if best is None else max(best, r)
    return best


def data_scale(batch: Sequence[tuple[str, Any]], model: Any) -> DataScale | None:
    """The :class:`~nanguard.core.case.DataScale` of a Keras batch (``[("x", t), ("y", t)]``)."""
    try:
        xs, ys = _floats(batch, "x"), _floats(batch, "y")
        if not xs:
            return None
        return DataScale(inputs_absmax=max(float(np.abs(a).max()) for a in xs), feature_spread=_spread(xs),
                         targets_absmax=max((float(np.abs(a).max()) for a in ys), default=None),
                         regression=regression_loss(model))
    except Exception:  # best-effort evidence: never an error in the user's run
        log.debug("nanguard: the data's scale could not be read", exc_info=True)
        return None
