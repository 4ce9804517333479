"""The rows a batch was cut from: a singularity only some rows reach, found on all of them.

Runs inside :class:`~nanguard.torch.hazards.HazardMode` (the watch's two sampled steps, and
``nanguard check``), on every op it sees. A batch is traced back to the tensor it was cut from:
a tensor that existed before the step (a ``TensorDataset``'s tensor, a script's ``mask``), its
rows selected along dim 0 (``x[i:j]``, ``x[idx]``, ``index_select``, the default collate's
``stack`` of ``x[i]``). The elementwise ops on the batch after that (``.float()``, ``== PAD``,
``~``, ``* 2``) are remembered, so that they can be replayed on the whole source. Then, when an
unsafe op reads it:

* a **division by data** (``err / y``) or by a **sum of non-negative data** (``s / m.sum()``):
  the rows of the source that are 0 (that sum to 0) make the divisor 0 in a batch that holds
  them (a batch made only of them, for a sum) — a zero sale, an empty line;
* a **softmax over scores filled with** ``-inf`` **where the data masks them**
  (``scores.masked_fill(pad, -inf)``): the rows of the source masked at every position give a
  softmax of ``-inf`` only, 0/0 — an empty document.

Only the batches of the sampled steps are traced, and each source is replayed once per chain of
ops, on the host, at most :data:`MAX_REPLAY` elements; nothing runs on other steps.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

__all__ = ["MAX_REPLAY", "Origin", "RowTrace"]

#: a source with more elements than this is not replayed (the look must stay cheap)
MAX_REPLAY = 1 << 24
#: ops that keep every value where it is (a view, a copy): the origin passes through
_SAME = frozenset({"view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "flatten", "expand",
                   "alias", "detach", "clone", "contiguous", "lift_fresh"})
#: elementwise ops replayed on the source (with scalars or 0-dim tensors beside the data; names
#: as :func:`~nanguard.core.ops.canonical_op` gives them: ``_to_copy`` is ``copy``)
_ELEMENTWISE = frozenset({"copy", "eq", "ne", "lt", "le", "gt", "ge", "logical_not", "bitwise_not",
                          "abs", "neg", "mul", "add", "sub", "div", "rsub"})
#: row selections along dim 0 (``slice`` and ``narrow`` take the dim as their second argument)
_ROWS = frozenset({"slice", "narrow", "index_select"})
_HERE = object()  # the data's place in a replayed op's arguments


@dataclass(frozen=True)
class Origin:
    """A batch's source (held weakly) and the elementwise ops made on its rows since."""

    root: weakref.ref[torch.Tensor]
    ops: tuple[tuple[Any, tuple[Any, ...], tuple[tuple[str, Any], ...]], ...]
    name: str  # "int64[320, 16]"
    batch: int  # rows of the batch as it was cut (before a reshape merged them)

    def values(self) -> torch.Tensor | None:
        """The ops replayed on the whole source (``None``: it is gone, or too large)."""
        t = self.root()
        if t is None or t.numel() > MAX_REPLAY:
            return None
        t = t.detach()
        for func, args, kwargs in self.ops:
            t = func(*[t if a is _HERE else a for a in args], **dict(kwargs))
        return t

    def then(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Origin:
        template = tuple(_HERE if i == 0 else a for i, a in enumerate(args))
        return Origin(self.root, (*self.ops, (func, template, tuple(kwargs.items()))), self.name, self.batch)

    def cut(self, rows: int) -> Origin:
        """The same source, ``rows`` of its rows selected."""
        return Origin(self.root, self.ops, self.name, rows)

    def key(self, what: str) -> tuple[int, str, str]:
        """Which replay this is: the source and the ops (a tensor beside the data: its shape)."""
        ops = [(str(f), [a if not isinstance(a, torch.Tensor) else tuple(a.shape) for a in args], kw)
               for f, args, kw in self.ops]
        return (id(self.root()), repr(ops), what)


def _source(t: torch.Tensor) -> bool:
    """A tensor that may be the source of batches: data, with rows, of a size that can be read."""
    return (not t.requires_grad and t.layout == torch.strided and t.device.type != "meta"
            and t.dim() >= 1 and t.shape[0] >= 2 and t.numel() <= MAX_REPLAY)


def _dim(args: Any, kwargs: dict[str, Any], i: int = 1) -> int:
    d = args[i] if len(args) > i else kwargs.get("dim", 0)
    return int(d) if isinstance(d, int) else -1


class RowTrace:
    """What :class:`~nanguard.torch.hazards.HazardMode` knows about the rows of its batches."""

    def __init__(self) -> None:
        self.origin: WeakIdKeyDictionary = WeakIdKeyDictionary()  # batch -> Origin
        self.picks: WeakIdKeyDictionary = WeakIdKeyDictionary()  # one row (``x[i]``) -> Origin
        #: a sum of a batch -> (Origin, whether it sums over the batch's rows)
        self.sums: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.fills: WeakIdKeyDictionary = WeakIdKeyDictionary()  # scores -> (Origin, the mask)
        self._rows_hit: dict[tuple[int, str, str], tuple[int, int]] = {}
        #: tensors made since the step began: not sources (``nanguard check`` sees the script
        #: make its data before the first step; from the next step on, that data is a source)
        self.fresh: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def new_step(self) -> None:
        """A step ended: what it made is from an earlier step now."""
        self.fresh = WeakIdKeyDictionary()

    def _of(self, t: Any) -> Origin | None:
        """The origin of ``t``, or a new one when ``t`` is a source (not made in the step)."""
        if not isinstance(t, torch.Tensor):
            return None
        o = self.origin.get(t)
        if o is None and t not in self.fresh and t not in self.picks and _source(t):
            name = f"{str(t.dtype).replace('torch.', '')}[{', '.join(str(int(d)) for d in t.shape)}]"
            o = Origin(weakref.ref(t), (), name, int(t.shape[0]))
        return o

    def made(self, func: Any, op: str, args: Any, kwargs: dict[str, Any], out: Any) -> None:
        """An op ran: its outputs are this step's; the rows they were cut from, followed."""
        for o in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(o, torch.Tensor):
                self.fresh[o] = True
        if not isinstance(out, torch.Tensor) or not args:
            return
        x = args[0]
        if op == "stack" and isinstance(x, (list, tuple)) and _dim(args, kwargs) == 0:
            picks = [self.picks.get(t) for t in x]
            first = picks[0] if picks else None
            if first is not None and all(p is not None and p.root() is first.root() and p.ops == first.ops
                                         for p in picks):
                self.origin[out] = first.cut(len(picks))
            return
        if op == "masked_fill" and len(args) > 2 and isinstance(args[2], float) and math.isinf(args[2]) \
                and args[2] < 0 and isinstance(args[1], torch.Tensor) and args[1] in self.origin:
            self.fills[out] = (self.origin[args[1]], args[1])
            return
        if isinstance(x, torch.Tensor) and x in self.fills and op in ("masked_fill", "div", "mul", "copy",
                                                                     "clone", "contiguous", "view"):
            if out.shape == x.shape:
                self.fills[out] = self.fills[x]  # scale after the fill (/ temperature), a second fill
            return
        self._rows(func, op, args, kwargs, out)

    def _rows(self, func: Any, op: str, args: Any, kwargs: dict[str, Any], out: torch.Tensor) -> None:
        x = args[0]
        o = self._of(x)
        if o is None:
            return
        if op in _SAME:
            self.origin[out] = o
        elif op == "index" and len(args) > 1 and len(args[1]) == 1 and args[1][0] is not None:
            self.origin[out] = o.cut(int(out.shape[0])) if out.dim() else o
        elif op in _ROWS:
            if _dim(args, kwargs) == 0:
                self.origin[out] = o.cut(int(out.shape[0]))
            elif op == "slice" and out.shape == x.shape:
                self.origin[out] = o
        elif op == "select" and _dim(args, kwargs) == 0:
            self.picks[out] = o
        elif op in ("sum", "mean"):
            dims = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else None
            whole = not dims or any(int(d) % x.dim() == 0 for d in dims)  # over the batch's rows
            self.sums[out] = (o, whole)
        elif op in _ELEMENTWISE and out is not x and out.shape == x.shape and all(
                not isinstance(a, torch.Tensor) or a.dim() == 0 for a in args[1:]):
            self.origin[out] = o.then(func, args, kwargs)

    def zero_divisor(self, d: torch.Tensor) -> str | None:
        """Is the divisor data, or a sum of data, that some rows of its source make 0? Said how."""
        o, need = self.origin.get(d), 1
        if o is None:
            got = self.sums.get(d)
            if got is None:
                return None
            o, whole = got
            need = o.batch if whole else 1  # a sum over the batch is 0 only if all its rows are
            said = self._once(o, "sum", lambda v: _zero_rows(v, True), need)
            return f"{said} sum to 0 (a batch made only of them divides by 0)" if said and whole else \
                f"{said} sum to 0" if said else None
        said = self._once(o, "div", lambda v: _zero_rows(v, False), need)
        return f"{said} hold a 0" if said else None

    def masked_softmax(self, x: torch.Tensor) -> tuple[str, float] | None:
        """Are these scores filled with ``-inf`` where data masks them, and does the source hold a
        row masked everywhere? (what is said, the fewest unmasked positions in a row of the batch)"""
        got = self.fills.get(x)
        if got is None:
            return None
        o, mask = got
        if mask.dtype != torch.bool or mask.dim() < 1:
            return None
        said = self._once(o, "softmax", _masked_rows, 1)
        if said is None:
            return None
        return said, float((~mask).reshape(-1, mask.shape[-1]).sum(-1).min())

    def _once(self, o: Origin, what: str, test: Any, need: int) -> str | None:
        """``test`` on the replayed source, once per replay: how many rows of how many, said,
        when at least ``need`` rows reach the singularity."""
        key = o.key(what)
        if key not in self._rows_hit:
            v = o.values()
            self._rows_hit[key] = (test(v), int(v.shape[0])) if v is not None and v.dim() >= 1 else (0, 0)
        hit, rows = self._rows_hit[key]
        return f"{hit} of {rows} rows of the {o.name} tensor the batches are cut from" if hit >= need > 0 else None


def _zero_rows(v: torch.Tensor, summed: bool) -> int:
    """Rows holding a 0 (a divisor taken as is), or summing to 0 (non-negative data only)."""
    zero = (v == 0).reshape(v.shape[0], -1)
    if not summed:
        return int(zero.any(1).sum())
    if v.dtype != torch.bool and bool((v < 0).any()):
        return 0  # signed values: a sum of them can be 0 by chance, not by a row of zeros
    return int(zero.all(1).sum())


def _masked_rows(v: torch.Tensor) -> int:
    """Rows of a boolean mask with a line masked at every position along the last dim."""
    if v.dtype != torch.bool:
        return 0
    full = v.reshape(v.shape[0], -1, v.shape[-1]).all(-1)
    return int(full.any(1).sum())
