"""Statistics of TensorFlow tensors for findings, computed on the host with numpy.

Used only after the watch tier fired (in the replay) or under ``locate()``: one copy of each
tensor that explains an op's result, never on a healthy step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.finding import Finding, TensorStats
from ._compat import tf, values_of

__all__ = ["bad_samples", "counts", "dtype_name", "finding_for", "is_finite", "tensor_stats", "to_numpy"]


def dtype_name(t: Any) -> str:
    dt = getattr(t, "dtype", None)
    if isinstance(dt, str):  # a Keras variable's dtype
        return dt
    return str(getattr(dt, "name", dt))


def to_numpy(t: Any) -> np.ndarray[Any, Any]:
    """The values of ``t`` as a float64 array (bfloat16/float16 included)."""
    arr = np.asarray(values_of(t).numpy() if hasattr(values_of(t), "numpy") else t)
    return arr if arr.dtype == np.float64 else arr.astype(np.float64)


def is_finite(t: Any) -> bool:
    """True when every element is finite. On the CPU a zero-copy numpy view; elsewhere one
    reduction on the device and a one-number transfer."""
    v = values_of(t)
    if not getattr(v.dtype, "is_floating", False):
        return True
    if "CPU" in (getattr(v, "device", "") or "CPU"):
        arr = np.asarray(v.numpy())
        if arr.dtype.kind != "f":  # bfloat16 arrives as ml_dtypes: exact either way
            arr = arr.astype(np.float32)
        return bool(np.isfinite(arr).all())
    return bool(tf.reduce_all(tf.math.is_finite(v)).numpy())


def counts(t: Any) -> tuple[int, int, int]:
    """(NaN, +Inf, -Inf) counts."""
    a = to_numpy(t)
    return int(np.isnan(a).sum()), int(np.isposinf(a).sum()), int(np.isneginf(a).sum())


def tensor_stats(t: Any, name: str) -> TensorStats:
    """Statistics over the finite elements, as the core's :class:`TensorStats`."""
    v = values_of(t)
    shape = tuple(int(s) for s in v.shape)
    a = to_numpy(v)
    st = TensorStats(name=name, dtype=dtype_name(v), shape=shape, numel=int(a.size))
    st.nan, st.posinf, st.neginf = int(np.isnan(a).sum()), int(np.isposinf(a).sum()), int(np.isneginf(a).sum())
    fin = a[np.isfinite(a)]
    if fin.size:
        st.zeros = int((fin == 0).sum())
        st.negatives = int((fin < 0).sum())
        st.min, st.max = float(fin.min()), float(fin.max())
        st.absmax = float(np.abs(fin).max())
        nz = np.abs(fin[fin != 0])
        if nz.size:
            st.smallest_abs_nonzero = float(nz.min())
    return st


def bad_samples(t: Any, limit: int = 20) -> list[dict[str, Any]]:
    """Which samples (rows of dimension 0) and features of a batch hold NaN/Inf."""
    a = to_numpy(t)
    if a.ndim == 0:
        return [{"index": 0, "kind": "NaN" if np.isnan(a) else "Inf"}]
    bad = ~np.isfinite(a)
    rows = np.flatnonzero(bad.reshape(bad.shape[0], -1).any(axis=1))[:limit]
    out: list[dict[str, Any]] = []
    for i in rows:
        row = bad[i].reshape(-1)
        feats = np.flatnonzero(row)[:8]
        vals = a[i].reshape(-1)[feats]
        kind = "NaN" if np.isnan(vals).any() else ("+Inf" if (vals > 0).all() else "Inf")
        d: dict[str, Any] = {"index": int(i), "kind": kind}
        if a.ndim == 2:
            d["features"] = [int(j) for j in feats]
        elif a.ndim > 2:
            d["features"] = [[int(k) for k in np.unravel_index(int(j), a.shape[1:])] for j in feats]
        out.append(d)
    return out


def finding_for(t: Any, phase: str, op: str | None, **fields: Any) -> Finding:
    """A Keras :class:`Finding` about the non-finite values of ``t``: its dtype, shape and NaN/±Inf
    counts filled in; every other field as given."""
    fields.setdefault("framework", "keras")
    if t is None:
        return Finding(phase=phase, op=op, **fields)
    nan, pinf, ninf = counts(t)
    return Finding(
        phase=phase, op=op, dtype=dtype_name(t), shape=tuple(int(s) for s in t.shape),
        nan=nan, posinf=pinf, neginf=ninf, **fields,
    )
