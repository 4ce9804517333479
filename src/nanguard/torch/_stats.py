"""Cheap finiteness checks and the statistics that explain an op's result.

The checks run inside the locator's ``__torch_dispatch__`` (the mode is popped there, so these torch
calls are not intercepted again) and inside the watch tier.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from ..core.finding import Finding, TensorStats

__all__ = ["all_finite", "checkable", "counts", "finding_for", "is_finite", "tensor_stats"]

_PLAIN = (torch.Tensor, torch.nn.Parameter)


def checkable(t: object) -> bool:
    """Is ``t`` a plain, dense, floating, non-empty tensor with real data?

    Integer, bool, complex, sparse, meta, empty and subclass tensors (FakeTensor, DTensor, ...) are
    never checked: they cannot hold NaN/Inf, or their values are not ours to read.
    """
    return (
        type(t) in _PLAIN
        and t.is_floating_point()  # type: ignore[attr-defined]
        and t.layout == torch.strided  # type: ignore[attr-defined]
        and not t.is_meta  # type: ignore[attr-defined]
        and t.numel() > 0  # type: ignore[attr-defined]
    )


def is_finite(t: torch.Tensor) -> bool:
    """True when every element of ``t`` is finite. One host sync.

    A sum in float32/float64 is one pass over memory; it is non-finite iff an element is, unless
    the finite values overflow the sum, in which case the exact (two-pass) check decides.
    """
    s = t.sum(dtype=torch.float64 if t.dtype == torch.float64 else torch.float32)
    if math.isfinite(s.item()):
        return True
    return bool(torch.isfinite(t).all().item())


def all_finite(tensors: Sequence[torch.Tensor]) -> bool:
    """Fused check of many tensors (one sync): ``torch._foreach_norm`` then a single reduction."""
    ts = [t for t in tensors if checkable(t)]
    if not ts:
        return True
    if len(ts) == 1:
        return is_finite(ts[0])
    by_dev: dict[torch.device, list[torch.Tensor]] = {}
    for t in ts:
        by_dev.setdefault(t.device, []).append(t)
    for group in by_dev.values():
        norms = torch._foreach_norm(group, ord=math.inf)
        s = torch.stack([n.float() for n in norms]).sum()
        if not math.isfinite(s.item()) and not all(
            bool(torch.isfinite(t).all().item()) for t in group
        ):
            return False
    return True


def counts(t: torch.Tensor) -> tuple[int, int, int]:
    """(NaN, +Inf, -Inf) counts of ``t``."""
    if not checkable(t):
        return 0, 0, 0
    c = torch.stack([torch.isnan(t).sum(), torch.isposinf(t).sum(), torch.isneginf(t).sum()])
    n, p, m = (int(v) for v in c.tolist())
    return n, p, m


def tensor_stats(t: torch.Tensor, name: str) -> TensorStats:
    """Statistics of ``t`` over its finite elements (computed in float64 on the tensor's device)."""
    dtype = str(t.dtype).replace("torch.", "")
    shape = tuple(int(s) for s in t.shape)
    st = TensorStats(name=name, dtype=dtype, shape=shape, numel=t.numel())
    if not checkable(t):
        return st
    x = t.detach()
    st.nan, st.posinf, st.neginf = counts(x)
    fin = x[torch.isfinite(x)].double()
    if fin.numel():
        vals = torch.stack(
            [
                (fin == 0).sum().double(),
                (fin < 0).sum().double(),
                fin.min(),
                fin.max(),
                fin.abs().max(),
            ]
        ).tolist()
        st.zeros, st.negatives = int(vals[0]), int(vals[1])
        st.min, st.max, st.absmax = vals[2], vals[3], vals[4]
        nz = fin.abs()[fin != 0]
        if nz.numel():
            st.smallest_abs_nonzero = float(nz.min().item())
    return st


def iter_tensors(obj: object) -> Iterable[torch.Tensor]:
    """Tensors inside nested lists/tuples/dicts (as in op arguments and module outputs)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from iter_tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from iter_tensors(o)


def finding_for(t: torch.Tensor | None, phase: str, op: str | None, **fields: Any) -> Finding:
    """A :class:`Finding` about the non-finite values of ``t``: its dtype, shape and NaN/±Inf
    counts filled in; every other field as given."""
    if t is None:
        return Finding(phase=phase, op=op, **fields)
    nan, pinf, ninf = counts(t)
    return Finding(
        phase=phase, op=op, dtype=str(t.dtype).replace("torch.", ""),
        shape=tuple(int(s) for s in t.shape), nan=nan, posinf=pinf, neginf=ninf, **fields,
    )
