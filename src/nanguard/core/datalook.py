"""Non-finite values the data already holds, found before a step reads them (framework-free).

The early warning ``data-nonfinite`` (:mod:`nanguard.core.early`) comes from a look at what is
already in memory: the arrays a dataset holds, the arrays handed to ``model.fit``, the float
arrays in the frames of the user's code. The adapters say when to look and how to read their own
tensors (a :class:`Reader`: torch's ``isfinite`` on the tensor's device, TensorFlow's eager
tensors as NumPy); this module counts, names and phrases what was found. NumPy arrays are read
here.

What counts is **a few** non-finite values among many finite ones (at most :data:`MAX_SHARE` of
the elements): the signature of a missing cell, a ``log(0)`` target or a logger's gap. Arrays
that are non-finite by design — a causal mask of ``-inf``, a column of ``NaN`` the script
masks — hold far more, and are left alone, as are memory-mapped arrays (reading them would page
the file in) and anything above :data:`MAX_ELEMENTS` elements.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

import numpy as np

from .early import EarlyWarning, NonFiniteData

__all__ = ["MAX_ELEMENTS", "MAX_ITEMS", "MAX_SHARE", "NUMPY", "Counts", "Reader", "array_counts",
           "is_array_data", "warning"]

MAX_SHARE = 0.05  # more non-finite elements than this share: by design (a mask, a marker)
MAX_ELEMENTS = 1 << 27  # larger arrays are not read (a healthy run must not wait for this)
MAX_ITEMS = 100_000  # a list of per-sample arrays longer than this is not walked

#: ``(nan, inf, rows, first_row, elements)`` of one array that is not all finite
Counts = tuple[int, int, int, int, int]


def array_counts(arr: np.ndarray) -> Counts | None:
    """The counts of a float NumPy array, ``None`` if it is all finite."""
    fin = np.isfinite(arr)
    if fin.all():
        return None
    n_nan = int(np.isnan(arr).sum())
    rows = (~fin).reshape(fin.shape[0], -1).any(1) if arr.ndim else (~fin).reshape(1)
    where = np.flatnonzero(rows)
    return n_nan, int((~fin).sum()) - n_nan, int(where.size), int(where[0]), int(arr.size)


def is_array_data(x: Any) -> bool:
    """A float NumPy array that may be read: not memory-mapped, not empty, not huge."""
    return (isinstance(x, np.ndarray) and not isinstance(x, np.memmap) and x.dtype.kind == "f"
            and 0 < x.size <= MAX_ELEMENTS)


def _shape(x: Any) -> str:
    dtype = getattr(x.dtype, "name", None)
    dtype = dtype if isinstance(dtype, str) else str(x.dtype).replace("torch.", "")
    return f"{dtype}[{', '.join(str(int(d)) for d in tuple(x.shape))}]"


@dataclass(frozen=True)
class Reader:
    """How one framework's values are read: which are data, and their counts and size."""

    is_data: Callable[[Any], bool]
    counts: Callable[[Any], Counts | None]  # called only on values ``is_data`` accepted
    size: Callable[[Any], int]

    def peek(self, name: str, x: Any) -> NonFiniteData | None:
        """One value: an array (tensor), or a list/tuple of per-sample ones."""
        if self.is_data(x):
            c = self.counts(x)
            if c is None or c[0] + c[1] > MAX_SHARE * c[4]:
                return None
            return NonFiniteData(name, _shape(x), c[0], c[1], c[2], c[3], int(x.shape[0]) if x.ndim else 1)
        if isinstance(x, (list, tuple)) and 1 < len(x) <= MAX_ITEMS and self.is_data(x[0]) and self.is_data(x[-1]):
            return self._items(name, x)
        return None

    def _items(self, name: str, items: list[Any] | tuple[Any, ...]) -> NonFiniteData | None:
        nan = inf = rows = elements = 0
        first = -1
        for i, t in enumerate(items):
            if not self.is_data(t):
                return None  # not a list of samples
            elements += self.size(t)
            c = self.counts(t)
            if c is not None:
                nan, inf, rows = nan + c[0], inf + c[1], rows + 1
                first = i if first < 0 else first
        if not rows or nan + inf > MAX_SHARE * elements:
            return None
        return NonFiniteData(name, f"list of {len(items)} {type(items[0]).__name__}s", nan, inf, rows, first,
                             len(items))

    def named(self, values: list[tuple[str, Any]]) -> list[NonFiniteData]:
        """What the named values hold (each value once)."""
        seen: set[int] = set()
        found: list[NonFiniteData] = []
        for name, value in values:
            if id(value) in seen or name.startswith("__"):
                continue
            seen.add(id(value))
            p = self.peek(name, value)
            if p is not None:
                found.append(p)
        return found

    def frames(self, frames: list[FrameType]) -> list[NonFiniteData]:
        """What the user's frames hold in their variables (locals, and each module's globals once)."""
        values: list[tuple[str, Any]] = []
        modules: set[int] = set()
        for f in frames:
            values.extend(dict(f.f_locals).items())
            if id(f.f_globals) not in modules:
                modules.add(id(f.f_globals))
                values.extend(list(f.f_globals.items()))
        return self.named(values)


#: NumPy arrays only
NUMPY = Reader(is_array_data, lambda x: array_counts(np.asarray(x)), lambda x: int(x.size))


def warning(found: list[NonFiniteData], step: int, where: str, projected: int | None) -> EarlyWarning:
    """The ``data-nonfinite`` warning for what was found (the first named, three more as evidence)."""
    w = found[0].warning(step, where, projected)
    w.evidence += [f"{p.name}: {p.what}, first in row {p.first_row}" for p in found[1:4]]
    return w
