"""Tensors and datasets: ``.pt``/``.pth`` files, safetensors, ``Dataset`` and ``DataLoader``.

``.pt`` files are loaded with ``torch.load(weights_only=True, mmap=True)``: no pickled code runs,
and tensors stay on disk until their chunk is read. safetensors files are read one tensor slice
at a time with ``safe_open(...).get_slice``. A ``Dataset`` is read item by item, a
``DataLoader`` batch by batch; every tensor, array or number in an item (tuples, lists and dicts
are walked) is one field of the report.
"""

from __future__ import annotations

import math
import os
import pickle
import re
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from ._check import Collector, Progress
from ._result import BadCell, ColumnStats, ScanError, ScanReport

__all__ = ["scan_dataset", "scan_pt", "scan_safetensors", "scan_tensor"]


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise ImportError("scanning .pt files and datasets needs torch: pip install 'nanguard[torch]'") from exc
    return torch


def _to_numpy(t: Any) -> np.ndarray:
    torch = _torch()
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype in (torch.bfloat16,) or (t.is_floating_point() and t.dtype not in
                                         (torch.float16, torch.float32, torch.float64)):
        t = t.float()  # bfloat16 and float8 have no numpy dtype; float32 holds them exactly
    if t.is_complex() and t.dtype == torch.complex32:
        t = t.to(torch.complex64)
    return np.asarray(t.numpy())


def _walk(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(name, leaf)`` for every tensor, array or number in nested dicts/lists/tuples."""
    torch = _torch()
    if isinstance(obj, (torch.Tensor, np.ndarray)):
        yield prefix or "tensor", obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _walk(v, f"{prefix}[{i}]")
    elif isinstance(obj, (bool, np.bool_)):
        return
    elif isinstance(obj, (int, float, np.number)) or obj is None:
        yield prefix or "value", obj


def scan_tensor(t: Any, name: str, report: ScanReport, col: Collector, chunk_bytes: int,
                bar: Progress | None = None) -> None:
    """One tensor, ``chunk_bytes`` at a time along its first dimension."""
    shape = tuple(t.shape) if t.dim() else (1,)
    dtype = str(t.dtype).replace("torch.", "")
    c = ColumnStats(name, f"{dtype}[{', '.join(map(str, tuple(t.shape)))}]")
    report.columns.append(c)
    if t.layout != _torch().strided or t.is_quantized or t.device.type == "meta":
        c.skipped = "not a dense tensor"
        return
    flat = t.reshape(shape)
    sample = shape[1:]
    k = math.prod(sample) if sample else 1
    per = max(1, chunk_bytes // max(1, k * t.element_size()))
    for a in range(0, shape[0], per):
        block = _to_numpy(flat[a : a + per]).reshape(-1, k)
        col.begin(a, block.shape[0])
        col.feed(c, block, sample_shape=sample)
        col.end()
        if bar is not None:
            bar.advance(block.shape[0] * k * t.element_size())
    report.rows = max(report.rows, shape[0])


def scan_pt(path: str, report: ScanReport, col: Collector, chunk_bytes: int, progress: bool) -> None:
    torch = _torch()
    report.format = "PyTorch (torch.load, weights_only=True)"
    report.unit = "sample"
    report.nbytes = os.path.getsize(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the weights-only unpickler's protocol notices
            obj = _load(torch, path, report)
    except pickle.UnpicklingError as exc:
        raise _refused(path, exc) from None
    leaves = list(_walk(obj))
    total = sum(t.numel() * t.element_size() for _, t in leaves if isinstance(t, torch.Tensor))
    with Progress(progress, os.path.basename(path), total) as bar:
        for name, leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                scan_tensor(leaf, name, report, col, chunk_bytes, bar)
            else:
                _scalar(name, leaf, report, col)


def _load(torch: Any, path: str, report: ScanReport) -> Any:
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic == b"PK\x03\x04":  # the zip format of torch.save: tensors stay on disk (mmap)
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    if not magic.startswith(b"\x80"):
        raise ScanError("not a file torch.save wrote: it is neither a zip archive nor a pickle")
    report.notes.append("legacy (non-zip) file: loaded whole, not memory-mapped")
    return torch.load(path, map_location="cpu", weights_only=True)  # the legacy format: no mmap


def _refused(path: str, exc: pickle.UnpicklingError) -> ScanError:
    """Why the weights-only unpickler refused ``path``: Python objects beyond tensors (loading
    them would run code from the file), or a pickle it cannot read at all."""
    # "Unsupported global: GLOBAL a.B", or "unsupported GLOBAL posix.system whose module ..."
    found = re.search(r"unsupported global:? (?:GLOBAL )?([\w.]+)", str(exc), re.IGNORECASE)
    if found:
        return ScanError(
            "holds Python objects beyond tensors (a pickled model?): not scanned, since nanguard "
            "loads .pt files with weights_only=True and never runs code from them"
            + f" (it holds a {found.group(1)})"
            + "; save the tensors instead: torch.save(model.state_dict(), path)"
        )
    why = re.search(r"WeightsUnpickler error: (.+)", str(exc))
    detail = why.group(1).strip() if why else str(exc).splitlines()[0]
    return ScanError(f"not a readable PyTorch file: its pickle is corrupt or not one torch.save "
                     f"wrote ({detail})")


def _scalar(name: str, v: Any, report: ScanReport, col: Collector) -> None:
    if isinstance(v, np.ndarray):
        from ._arrays import scan_array

        scan_array(v, name, report, col, 1 << 25)
        return
    c = ColumnStats(name, type(v).__name__)
    report.columns.append(c)
    if v is None:
        c.count = 1
        c.missing = 1
        col.add_cells([0], [BadCell(name, "missing", "None")])
        return
    col.begin(0, 1)
    col.feed(c, np.asarray([[v]]))
    col.end()


def scan_safetensors(path: str, report: ScanReport, col: Collector, chunk_bytes: int,
                     progress: bool) -> None:
    try:
        from safetensors import safe_open
    except ImportError as exc:
        raise ImportError("reading .safetensors needs safetensors: pip install safetensors") from exc
    try:
        _torch()
        framework = "pt"
    except ImportError:
        framework = "numpy"
    report.format = "safetensors"
    report.unit = "sample"
    report.nbytes = os.path.getsize(path)
    with safe_open(path, framework=framework) as f, Progress(progress, os.path.basename(path),
                                                             report.nbytes) as bar:
        for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
            sl = f.get_slice(name)
            shape = tuple(sl.get_shape())
            dtype = str(sl.get_dtype()).lower()
            c = ColumnStats(name, f"{dtype}[{', '.join(map(str, shape))}]")
            report.columns.append(c)
            rows = shape[0] if shape else 1
            k = math.prod(shape[1:]) if len(shape) > 1 else 1
            item = _ITEMSIZE.get(dtype, 4)
            per = max(1, chunk_bytes // max(1, k * item))
            for a in range(0, rows, per):
                part = sl[a : a + per] if shape else f.get_tensor(name)
                block = _to_numpy(part) if framework == "pt" else np.asarray(part)
                block = block.reshape(-1, k)
                col.begin(a, block.shape[0])
                col.feed(c, block, sample_shape=shape[1:])
                col.end()
                bar.advance(block.size * item)
            report.rows = max(report.rows, rows)


_ITEMSIZE = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2, "i64": 8, "i32": 4, "i16": 2, "i8": 1,
             "u8": 1, "bool": 1, "f8_e4m3": 1, "f8_e5m2": 1, "float64": 8, "float32": 4,
             "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4}


# ----------------------------------------------------------------------------------------------
# datasets


class _Fields:
    """One :class:`ColumnStats` per field of a dataset item, created as fields show up."""

    def __init__(self, report: ScanReport) -> None:
        self.report = report
        self.by_name: dict[str, ColumnStats] = {}

    def get(self, name: str, dtype: str) -> ColumnStats:
        c = self.by_name.get(name)
        if c is None:
            c = self.by_name[name] = ColumnStats(name, dtype)
            self.report.columns.append(c)
        return c


def _leaf_block(leaf: Any, batched: bool) -> tuple[np.ndarray, tuple[int, ...]] | None:
    torch = _torch()
    if isinstance(leaf, torch.Tensor):
        arr = _to_numpy(leaf)
    elif isinstance(leaf, np.ndarray):
        arr = leaf
    elif isinstance(leaf, (int, float, np.number)):
        arr = np.asarray([leaf] if batched else leaf)
    else:
        return None
    if arr.dtype.hasobject:
        return None
    if not batched:
        arr = arr.reshape((1, *arr.shape))
    elif arr.ndim == 0:
        arr = arr.reshape(1)
    sample = tuple(arr.shape[1:])
    return arr.reshape(arr.shape[0], -1), sample


def scan_dataset(obj: Any, report: ScanReport, col: Collector, progress: bool,
                 max_samples: int | None = None) -> None:
    """Every item of a ``Dataset`` (by index, or by iteration) or every batch of a
    ``DataLoader`` (sample numbers count items in the order the loader yields them)."""
    torch = _torch()
    from torch.utils.data import DataLoader

    loader = isinstance(obj, DataLoader)
    report.format = "DataLoader" if loader else "Dataset"
    report.unit = "sample"
    if loader and not isinstance(getattr(obj, "sampler", None), torch.utils.data.SequentialSampler):
        report.notes.append(
            f"the DataLoader draws samples with a {type(obj.sampler).__name__}: sample numbers are "
            "positions in this pass, not dataset indices (nanguard.scan(loader.dataset) gives those)")
    fields = _Fields(report)
    try:
        total: int | None = len(obj.dataset) if loader else len(obj)
    except TypeError:
        total = None
    if max_samples is not None and total is not None:
        total = min(total, max_samples)
    seen = 0
    with Progress(progress, type(obj).__name__, total, unit="samples") as bar:
        it: Iterator[Any] = iter(obj) if loader or not hasattr(obj, "__getitem__") or total is None \
            else (obj[i] for i in range(total))
        for b, item in enumerate(it):
            leaves = list(_walk(item))
            n = 1
            if loader:
                sizes = [int(v.shape[0]) for _, v in leaves
                         if isinstance(v, (torch.Tensor, np.ndarray)) and v.ndim > 0]
                n = sizes[0] if sizes else 1
            if loader:
                def where(row: int, b: int = b, start: int = seen) -> str:
                    return f"batch {b}, item {row - start}"
            col.begin(seen, n, where if loader else None)
            for name, leaf in leaves:
                name = name or "item"
                if leaf is None:
                    c = fields.get(name, "None")
                    c.count += n
                    c.missing += n
                    col.add_cells([seen], [BadCell(name, "missing", "None")])
                    if col._mask is not None:
                        col._mask[:] = True
                    continue
                got = _leaf_block(leaf, batched=loader)
                if got is None:
                    continue
                block, sample = got
                c = fields.get(name, str(getattr(leaf, "dtype", type(leaf).__name__)).replace("torch.", ""))
                if block.shape[0] != n:  # a field without the batch dimension: one row
                    col.feed(c, block.reshape(1, -1))
                else:
                    col.feed(c, block, sample_shape=sample)
            col.end()
            seen += n
            bar.advance(n)
            if max_samples is not None and seen >= max_samples:
                report.notes.append(f"stopped after {seen} samples (max_samples)")
                break
    report.rows = seen
