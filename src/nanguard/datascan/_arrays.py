"""NumPy data: ``.npy`` and ``.npz`` files streamed in chunks, and arrays in memory.

A C-ordered ``.npy`` file (and each member of an ``.npz``, compressed or not) is read with
``readinto`` into one reusable buffer of ``chunk_bytes``: memory stays bounded whatever the file
size, and no page of the file stays mapped. Fortran-ordered files are read through
``np.load(mmap_mode="r")`` in row chunks. Nothing is unpickled (``allow_pickle=False``).
"""

from __future__ import annotations

import math
import zipfile
from collections.abc import Iterator, Mapping
from typing import IO, Any

import numpy as np

from ._check import Collector, Progress
from ._result import UNREADABLE, ColumnStats, ScanError, ScanReport

__all__ = ["scan_array", "scan_arrays", "scan_npy", "scan_npz"]


def _columns(name: str, dtype: np.dtype[Any], shape: tuple[int, ...]) -> list[ColumnStats] | ColumnStats:
    """A 2-D array gets one entry per feature (column); any other shape one entry."""
    dt = str(dtype)
    if len(shape) == 2 and name == "":
        return [ColumnStats(f"[:, {j}]", dt) for j in range(shape[1])]
    return ColumnStats(name or "array", dt)


def _rows_per_chunk(row_bytes: int, chunk_bytes: int) -> int:
    return max(1, chunk_bytes // max(1, row_bytes))


def _feed_chunks(
    col: Collector,
    cols: list[ColumnStats] | ColumnStats,
    chunks: Iterator[np.ndarray],
    shape: tuple[int, ...],
    row0: int = 0,
) -> int:
    """Feed ``chunks`` (each ``rows × sample``) to the collector; returns the rows seen."""
    sample = shape[1:] if len(shape) > 1 else ()
    k = math.prod(sample) if sample else 1
    seen = 0
    for chunk in chunks:
        n = chunk.shape[0] if chunk.ndim else 1
        col.begin(row0 + seen, n)
        col.feed(cols, chunk.reshape(n, k), sample_shape=sample if isinstance(cols, ColumnStats) else None)
        col.end()
        seen += n
    return seen


def _stream(fh: IO[bytes], dtype: np.dtype[Any], shape: tuple[int, ...], chunk_bytes: int,
            progress: Progress) -> Iterator[np.ndarray]:
    """Rows of a C-ordered array from a file object, ``chunk_bytes`` at a time."""
    rows = shape[0] if shape else 1
    row_items = math.prod(shape[1:]) if len(shape) > 1 else 1
    row_bytes = row_items * dtype.itemsize
    per = _rows_per_chunk(row_bytes, chunk_bytes)
    buf = bytearray(per * row_bytes)
    done = 0
    while done < rows:
        n = min(per, rows - done)
        view = memoryview(buf)[: n * row_bytes]
        got = 0
        while got < len(view):
            r = fh.readinto(view[got:])  # type: ignore[attr-defined]
            if not r:
                raise ScanError(f"the file ends after {done * row_bytes + got} bytes of data; "
                                 f"its header says {rows * row_bytes}")
            got += r
        arr = np.frombuffer(view, dtype=dtype, count=n * row_items)
        yield arr.reshape((n, *shape[1:]) if shape else (1,))
        progress.advance(n * row_bytes)
        done += n


def _header(fh: IO[bytes], objects_ok: bool = False) -> tuple[tuple[int, ...], bool, np.dtype[Any]]:
    version = np.lib.format.read_magic(fh)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
    else:
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
    if dtype.hasobject and not objects_ok:
        raise ScanError("holds Python objects (a pickle): not scanned; nanguard never unpickles")
    return tuple(shape), bool(fortran), dtype


def scan_npy(path: str, report: ScanReport, col: Collector, chunk_bytes: int, progress: bool) -> None:
    import os

    report.format = "NPY"
    report.unit = "row"
    report.nbytes = os.path.getsize(path)
    with open(path, "rb") as fh:
        shape, fortran, dtype = _header(fh)
        report.format = f"NPY {dtype}[{', '.join(map(str, shape))}]"
        if len(shape) != 2:
            report.unit = "sample" if len(shape) > 2 else "element"
        cols = _columns("", dtype, shape)
        report.columns = cols if isinstance(cols, list) else [cols]
        with Progress(progress, os.path.basename(path), report.nbytes) as bar:
            if fortran and len(shape) > 1:
                mm = np.load(path, mmap_mode="r", allow_pickle=False)
                per = _rows_per_chunk(mm[0].nbytes, chunk_bytes)

                def chunks() -> Iterator[np.ndarray]:
                    for a in range(0, shape[0], per):
                        c = np.ascontiguousarray(mm[a : a + per])
                        bar.advance(c.nbytes)
                        yield c

                report.rows = _feed_chunks(col, cols, chunks(), shape)
                report.notes.append("Fortran-ordered array: read through a memory map")
            else:
                report.rows = _feed_chunks(col, cols, _stream(fh, dtype, shape, chunk_bytes, bar), shape)


def scan_npz(path: str, report: ScanReport, col: Collector, chunk_bytes: int, progress: bool) -> None:
    """Each member array streamed from the zip (compressed members are decompressed as read)."""
    import os

    report.format = "NPZ"
    report.unit = "sample"
    report.nbytes = os.path.getsize(path)
    with zipfile.ZipFile(path) as zf, Progress(progress, os.path.basename(path),
                                               sum(i.file_size for i in zf.infolist())) as bar:
        members = [i for i in zf.infolist() if i.filename.endswith(".npy")]
        report.format = f"NPZ, {len(members)} array{'' if len(members) == 1 else 's'}"
        for info in members:
            name = info.filename[: -len(".npy")]
            with zf.open(info) as fh:
                shape, fortran, dtype = _header(fh, objects_ok=True)
                if dtype.hasobject:  # never unpickled: the scan is not complete
                    report.columns.append(ColumnStats(name, "object", skipped=UNREADABLE))
                    continue
                c = ColumnStats(name, f"{dtype}[{', '.join(map(str, shape))}]")
                report.columns.append(c)
                if fortran and len(shape) > 1:
                    arr = np.load(path, allow_pickle=False)[name]
                    rows = _feed_chunks(col, c, _split(np.ascontiguousarray(arr), chunk_bytes), shape)
                    bar.advance(info.file_size)
                else:
                    rows = _feed_chunks(col, c, _stream(fh, dtype, shape, chunk_bytes, bar), shape)
                report.rows = max(report.rows, rows)


def _split(arr: np.ndarray, chunk_bytes: int) -> Iterator[np.ndarray]:
    if arr.ndim == 0:
        yield arr.reshape(1)
        return
    per = _rows_per_chunk(arr[0].nbytes if arr.shape[0] else 1, chunk_bytes)
    for a in range(0, arr.shape[0], per):
        yield arr[a : a + per]


def scan_array(arr: np.ndarray, name: str, report: ScanReport, col: Collector, chunk_bytes: int) -> None:
    """An array in memory (chunked all the same: the temporaries stay small)."""
    if arr.dtype.hasobject:
        report.columns.append(ColumnStats(name or "array", "object", skipped=UNREADABLE))
        return
    shape = tuple(arr.shape) if arr.ndim else (1,)
    cols = _columns(name, arr.dtype, shape)
    report.columns.extend(cols if isinstance(cols, list) else [cols])
    if len(shape) != 2 or name:
        report.unit = "sample"
    rows = _feed_chunks(col, cols, _split(np.ascontiguousarray(arr).reshape(shape), chunk_bytes), shape)
    report.rows = max(report.rows, rows)


def scan_arrays(arrays: Mapping[str, Any], report: ScanReport, col: Collector, chunk_bytes: int) -> None:
    """A dict of arrays (``np.load`` of an ``.npz``, a batch dict)."""
    report.unit = "sample"
    for name, a in arrays.items():
        scan_array(np.asarray(a), str(name), report, col, chunk_bytes)
