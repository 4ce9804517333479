"""Arrow tables: Parquet files, ``pyarrow.Table`` and pandas data frames, one batch at a time
(CSV is read by ``_csv``).

Parquet columns keep their types: nulls are *missing*; numbers (also inside list columns, e.g.
embeddings) are checked; strings, dates and structs are not. Parquet is read with
``ParquetFile.iter_batches``: memory is bounded by the batch and by one row group's pages.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ._check import Collector, Progress
from ._csv import _pyarrow
from ._result import BadCell, ColumnStats, ScanReport

__all__ = ["scan_parquet", "scan_table"]


def scan_parquet(path: str, report: ScanReport, col: Collector, chunk_bytes: int, progress: bool) -> None:
    _pyarrow()
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    meta = pf.metadata
    report.format = f"Parquet, {meta.num_row_groups} row group{'' if meta.num_row_groups == 1 else 's'}"
    report.unit = "row"
    report.nbytes = os.path.getsize(path)
    rg_bytes = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    row_bytes = max(1, rg_bytes // max(1, meta.num_rows))
    batch_rows = max(1024, chunk_bytes // row_bytes)
    state = _TableState(pf.schema_arrow, report)
    row0 = 0
    with Progress(progress, os.path.basename(path), meta.num_rows, unit="rows") as bar:
        for batch in pf.iter_batches(batch_size=batch_rows):
            state.feed(batch, row0, col)
            row0 += batch.num_rows
            bar.advance(batch.num_rows)
    report.rows = row0


def scan_table(table: Any, report: ScanReport, col: Collector, chunk_bytes: int) -> None:
    """A ``pyarrow.Table`` / ``RecordBatch`` (a pandas DataFrame is converted to one first)."""
    _pyarrow()
    report.unit = "row"
    state = _TableState(table.schema, report)
    row_bytes = max(1, int(table.nbytes) // max(1, table.num_rows))
    row0 = 0
    batches = table.to_batches(max_chunksize=max(1024, chunk_bytes // row_bytes)) \
        if hasattr(table, "to_batches") else [table]
    for batch in batches:
        state.feed(batch, row0, col)
        row0 += batch.num_rows
    report.rows = row0


class _TableState:
    """Columns of an Arrow schema and how each is checked."""

    def __init__(self, schema: Any, report: ScanReport) -> None:
        import pyarrow as pa

        self.kinds: list[str] = []
        self.cols: list[ColumnStats] = []
        for field in schema:
            t = field.type
            if pa.types.is_dictionary(t):
                t = t.value_type
            kind = "skip"
            if pa.types.is_floating(t) or pa.types.is_integer(t) or pa.types.is_decimal(t):
                kind = "number"
            elif pa.types.is_boolean(t):
                kind = "nulls"
            elif (pa.types.is_list(t) or pa.types.is_large_list(t)
                  or pa.types.is_fixed_size_list(t)) and (
                      pa.types.is_floating(t.value_type) or pa.types.is_integer(t.value_type)):
                kind = "list"
            skipped = None
            if kind == "skip":
                skipped = "text column" if (pa.types.is_string(t) or pa.types.is_large_string(t)) \
                    else f"{t} not checked"
            self.kinds.append(kind)
            self.cols.append(ColumnStats(field.name, str(field.type), skipped=skipped))
        report.columns = self.cols

    def feed(self, batch: Any, row0: int, col: Collector) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        n = batch.num_rows
        col.begin(row0, n)
        for j, (kind, c) in enumerate(zip(self.kinds, self.cols)):
            arr = batch.column(j)
            if isinstance(arr, pa.ChunkedArray):
                arr = arr.combine_chunks()
            if pa.types.is_dictionary(arr.type):
                arr = arr.dictionary_decode()
            if kind == "skip":
                c.count += n
                continue
            miss = arr.is_null().to_numpy(zero_copy_only=False).reshape(n, 1)
            if kind == "nulls":
                col.feed([c], np.zeros((n, 1), dtype=bool), missing=miss, raw=lambda r, k: "null")
                continue
            if kind == "number":
                if pa.types.is_decimal(arr.type):
                    arr = pc.cast(arr, pa.float64())
                vals = pc.fill_null(arr, 0).to_numpy(zero_copy_only=False).reshape(n, 1)
                col.feed([c], vals, missing=miss, raw=lambda r, k: "null")
                continue
            # list column: every value of every list; a row is bad when any of its values is
            flat = pc.list_flatten(arr)
            parents = pc.list_parent_indices(arr).to_numpy(zero_copy_only=False)
            fmiss = flat.is_null().to_numpy(zero_copy_only=False)
            vals = pc.fill_null(flat, 0).to_numpy(zero_copy_only=False)
            before = c.count
            sub = Collector(col.report, col.max_rows, col.fp16)
            sub.begin(0, len(vals))
            tmp = ColumnStats(c.name, c.dtype)
            sub.feed([tmp], vals.reshape(-1, 1), missing=fmiss.reshape(-1, 1), raw=lambda r, k: "null")
            bad_flat = sub._mask if sub._mask is not None else np.zeros(0, bool)
            for attr in ("nan", "posinf", "neginf", "missing", "fp16"):
                setattr(c, attr, getattr(c, attr) + getattr(tmp, attr))
            if tmp.min is not None and tmp.max is not None:
                Collector._minmax(c, tmp.min, tmp.max)
            c.count = before + int(tmp.count)
            nulls = miss[:, 0]
            c.missing += int(nulls.sum())  # a null list: a missing sample
            bad_rows = np.zeros(n, dtype=bool)
            if bad_flat.size:
                bad_rows[parents[bad_flat]] = True
            rows, cells = [], []
            for r in np.flatnonzero(nulls)[: col.max_rows]:
                rows.append(row0 + int(r))
                cells.append(BadCell(c.name, "missing", "null"))
            offsets = np.flatnonzero(bad_flat)[: col.max_rows]
            for i in offsets:
                p = int(parents[i])
                start = int(np.searchsorted(parents, p))
                rows.append(row0 + p)
                kind_ = ("missing" if fmiss[i] else "nan" if np.isnan(vals[i]) else
                         "+inf" if vals[i] == np.inf else "-inf" if vals[i] == -np.inf else "fp16")
                cells.append(BadCell(c.name, kind_, "null" if fmiss[i] else f"{float(vals[i]):.6g}",
                                     f"[{int(i) - start}]"))
            col.add_cells(rows, cells)
            if col._mask is not None:
                col._mask |= bad_rows | nulls
        col.end()
