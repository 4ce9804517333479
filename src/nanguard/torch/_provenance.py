"""Provenance: which origin each non-finite tensor came from, and which values lie unused.

Kept by the locator while it runs (every op under ``--trace``/``locate()``, the failing step's
ops in a replay). Every non-finite tensor maps to the :class:`Origin` of its values: the op that
made them from finite inputs, or the bad input they came in with. An op that reads a non-finite
tensor *uses* it; an origin made by an op from finite inputs (and not on purpose, as a ``-inf``
mask is) is *open* while one of its non-finite values has not been used by any op — a value that
is dropped unused stays open for good. When a step, a ``locate()`` block or the script ends, an
origin still open is a finding (its values went nowhere that made them finite); one whose values
were all used, and ended in ops that made them finite again (the softmax of a causal mask), was
harmless.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..core.finding import Finding

__all__ = ["IdMap", "Origin", "Provenance"]

_SEQ = itertools.count()


@dataclass
class Origin:
    """Where a family of non-finite values came from (one per origin op / bad input).

    ``deliberate``: made from an explicit inf/nan constant or as a mask (``masked_fill(m, -inf)``,
    ``log`` of a 0/1 mask): a finding only when it reaches a sink. ``judged``: made by an op from
    finite inputs — a finding wherever its values go, unless all of them were used and made
    finite again (see :class:`Provenance`). ``born``: the step boundary count when it was made.
    """

    finding: Finding
    seq: int = field(default_factory=lambda: next(_SEQ))
    deliberate: bool = False
    judged: bool = False
    born: int = 0
    open: int = 0  # its non-finite values not yet used by an op (or dropped unused)
    wrote: list[weakref.ref[torch.Tensor]] = field(default_factory=list)  # tensors written in place


class IdMap:
    """``tensor -> value`` keyed by identity with weak references: an int dict lookup per query
    (``torch.utils.weak.WeakIdKeyDictionary`` allocates a reference object per lookup)."""

    def __init__(self) -> None:
        self._d: dict[int, tuple[weakref.ref[torch.Tensor], Any]] = {}

    def __bool__(self) -> bool:
        return bool(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, t: object) -> bool:
        e = self._d.get(id(t))
        return e is not None and e[0]() is t

    def get(self, t: object, default: Any = None) -> Any:
        e = self._d.get(id(t))
        if e is None or e[0]() is not t:
            return default
        return e[1]

    def __setitem__(self, t: torch.Tensor, value: Any) -> None:
        key = id(t)
        d = self._d

        def drop(_ref: object, k: int = key) -> None:
            d.pop(k, None)

        d[key] = (weakref.ref(t, drop), value)

    def pop(self, t: object, default: Any = None) -> Any:
        if t in self:
            return self._d.pop(id(t))[1]
        return default

    def items(self) -> list[tuple[torch.Tensor, Any]]:
        out = []
        for ref, v in list(self._d.values()):
            t = ref()
            if t is not None:
                out.append((t, v))
        return out


class Provenance:
    """The tensor → origin map, and the bookkeeping of unused values.

    ``on_open(True)`` is called when some origin becomes open while none was, ``on_open(False)``
    when the last one closes (the run session arms its end-of-script check only meanwhile).
    """

    def __init__(self, on_open: Callable[[bool], None] | None = None) -> None:
        self.recs = IdMap()  # non-finite tensor -> Origin
        self.unused = IdMap()  # non-finite tensor of a judged origin that no op has read yet
        self.open: dict[int, Origin] = {}  # seq -> open origin
        self.boundary = 0  # step boundaries seen
        self._on_open = on_open

    def __bool__(self) -> bool:
        return bool(self.recs)

    def __contains__(self, t: object) -> bool:
        return t in self.recs

    def get(self, t: object) -> Origin | None:
        o: Origin | None = self.recs.get(t)
        return o

    def mark(self, t: torch.Tensor, origin: Origin, counts: bool = True) -> None:
        """``t`` holds non-finite values of ``origin`` (an op's output, or a tensor it wrote);
        ``counts=False``: a by-product for autograd (layer norm's ``rstd``), never judged unused."""
        self.recs[t] = origin
        if counts and origin.judged and t not in self.unused:
            self.unused[t] = origin
            origin.open += 1
            if origin.open == 1:
                self._set_open(origin, True)

    def use(self, tensors: Iterable[object]) -> None:
        """An op read ``tensors``: their values are used (what it made is marked separately)."""
        if not self.unused:
            return
        for t in tensors:
            o: Origin | None = self.unused.pop(t)
            if o is not None:
                o.open -= 1
                if o.open == 0:
                    self._set_open(o, False)

    def clean(self, t: object) -> None:
        """An in-place op left ``t`` finite (``nan_to_num_``, ``masked_fill_``)."""
        self.recs.pop(t, None)

    def close(self, origin: Origin) -> None:
        """``origin`` was reported: it is judged no more."""
        origin.judged = False
        if origin.open:
            origin.open = 0
            self._set_open(origin, False)

    def open_before(self, boundary: int | None) -> list[Origin]:
        """Open origins made before step boundary ``boundary`` (``None``: all), oldest first."""
        return sorted(
            (o for o in self.open.values() if boundary is None or o.born < boundary), key=lambda o: o.seq
        )

    def _set_open(self, origin: Origin, is_open: bool) -> None:
        was = bool(self.open)
        if is_open:
            self.open[origin.seq] = origin
        else:
            self.open.pop(origin.seq, None)
        if self._on_open is not None and was != bool(self.open):
            self._on_open(bool(self.open))
