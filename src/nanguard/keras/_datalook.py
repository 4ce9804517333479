"""The Keras guard's looks ahead of the first NaN that read values, not the history: the data.

* ``model.fit(x, y, sample_weight=...)`` — when ``fit`` is called under ``nanguard run`` (the
  session's wrapper, before Keras builds its data adapter), the NumPy arrays and eager tensors
  it was given (alone, in a list or a dict) get one ``isfinite`` pass; with ``shuffle=False``
  the step whose batch holds the first bad row is projected.
* after the first healthy step — once, the float NumPy arrays and eager tensors in the frames of
  the user's code (the arrays a ``tf.data`` pipeline or a custom loop slices its batches from).
* after each optimizer's first healthy step — are its variables float16? Then the early
  warnings' headroom rule watches the loss and the gradient norm against 65504.

A ``tf.data.Dataset``, a ``PyDataset`` or a generator is never iterated: no user code runs, no
random number is drawn. What counts as "a few" non-finite values is
:mod:`nanguard.core.datalook`'s.
"""

from __future__ import annotations

import logging
import math
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..core.controller import StepController
from ..core.datalook import MAX_ELEMENTS, Reader, array_counts, is_array_data, warning
from ..core.early import NonFiniteData
from ..core.ops import DTYPE_MAX
from ..core.source import user_frames
from ._compat import tf
from .watch import GuardState

__all__ = ["KERAS", "DataLook", "fit_arrays"]

log = logging.getLogger("nanguard")


def _is_data(x: Any) -> bool:
    """A float NumPy array or eager (not symbolic) TensorFlow tensor, not huge."""
    if isinstance(x, tf.Tensor):
        return (hasattr(x, "numpy") and x.dtype.is_floating and x.shape.is_fully_defined()
                and 0 < x.shape.num_elements() <= MAX_ELEMENTS)
    return is_array_data(x)


def _size(x: Any) -> int:
    return int(x.shape.num_elements()) if isinstance(x, tf.Tensor) else int(x.size)


#: TensorFlow's eager tensors (read as NumPy) and NumPy arrays
KERAS = Reader(_is_data, lambda x: array_counts(np.asarray(x.numpy() if isinstance(x, tf.Tensor) else x)),
               _size)


def _flat(name: str, value: Any) -> list[tuple[str, Any]]:
    """A ``fit`` argument's arrays: itself, or every leaf of the lists, tuples and dicts it nests
    (a model of several inputs or outputs); a leaf is never read as a list of samples."""
    if isinstance(value, Mapping):
        return [pair for k, v in value.items() for pair in _flat(f"{name}[{k!r}]", v)]
    if isinstance(value, (list, tuple)):
        return [pair for i, v in enumerate(value) for pair in _flat(f"{name}[{i}]", v)]
    return [(name, value)] if _is_data(value) else []


def fit_arrays(arguments: Mapping[str, Any], looked: dict[int, weakref.ref[Any]] | None = None) -> list[NonFiniteData]:
    """What the arrays handed to ``fit`` hold (``x``, ``y``, ``sample_weight``); those in
    ``looked`` (read at an earlier ``fit``, by ``id`` with a weak reference, as NumPy arrays are
    not hashable) are not read again, the others are added to it."""
    values = [pair for k in ("x", "y", "sample_weight") if arguments.get(k) is not None
              for pair in _flat(k, arguments[k])]
    if looked is not None:
        fresh = []
        for name, v in values:
            ref = looked.get(id(v))
            if ref is not None and ref() is v:
                continue
            try:
                looked[id(v)] = weakref.ref(v)
            except TypeError:  # not weakly referable: read it each time
                pass
            fresh.append((name, v))
        values = fresh
    return KERAS.named(values)


def _projected(arguments: Mapping[str, Any], found: NonFiniteData, step: int) -> int | None:
    """With ``shuffle=False`` the batches come in order: the step that reads the first bad row,
    before the ``validation_split`` tail and within the steps ``fit`` runs. The batch size is
    Keras's: ``batch_size``, else ``ceil(rows / steps_per_epoch)``, else 32."""
    if arguments.get("shuffle", True) or not found.name.startswith(("x", "y", "sample_weight")):
        return None
    split = 0.0 if arguments.get("validation_data") is not None else float(arguments.get("validation_split") or 0.0)
    train_rows = math.floor(found.total_rows * (1.0 - split))
    if found.first_row >= train_rows:
        return None
    per_epoch = arguments.get("steps_per_epoch")
    bs = int(arguments.get("batch_size") or (math.ceil(train_rows / int(per_epoch)) if per_epoch else 32))
    ahead = found.first_row // bs
    epochs = int(arguments.get("epochs") or 1) - int(arguments.get("initial_epoch") or 0)
    if per_epoch and ahead >= int(per_epoch) * epochs:  # one iterator across epochs: fit runs no more
        return None
    return step + ahead


class DataLook:
    """The Keras guard's look at the data ahead (an observer: told when ``fit`` starts and when a
    healthy step ends)."""

    def __init__(self, controller: StepController) -> None:
        self.controller = controller
        self._frames_looked = False
        self._fit_looked: dict[int, weakref.ref[Any]] = {}

    def _said(self) -> bool:
        return "data-nonfinite" in {w.kind for w in self.controller.early.warnings}

    def fit_started(self, arguments: Mapping[str, Any], step: int) -> None:
        """``model.fit`` was called (before its first step): look at the arrays it was given,
        until one holds a few NaN/Inf (each array once)."""
        if self._said():
            return
        try:
            found = sorted(fit_arrays(arguments, self._fit_looked), key=lambda p: p.first_row)
            if found:
                self.controller.early.add(warning(found, step, "an argument of fit",
                                                  _projected(arguments, found[0], step)))
        except Exception:  # a value nanguard cannot read: the look is best-effort
            log.debug("nanguard: the look at fit's arguments failed", exc_info=True)
            return

    def after_healthy_step(self, state: GuardState, step: int) -> None:
        """After a healthy step's record (``step``: the next one's index)."""
        if not state.dtype_noted:
            state.dtype_noted = True
            try:
                if any(getattr(v, "dtype", None) in ("float16", tf.float16) for v in state.var_refs):
                    self.controller.early.low_max = DTYPE_MAX["float16"]
            except Exception:  # a variable nanguard cannot read: the rule stays off
                log.debug("nanguard: cannot read a variable's dtype", exc_info=True)
        if self._frames_looked:
            return
        self._frames_looked = True
        if self._said():
            return
        try:
            found = KERAS.frames(user_frames(2))
            if found:
                self.controller.early.add(warning(found, max(step - 1, 0), "the script's variables", None))
        except Exception:  # a value nanguard cannot read: the look is best-effort
            log.debug("nanguard: the look at the script's variables failed", exc_info=True)
            return
