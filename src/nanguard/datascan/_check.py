"""The vectorised check of one chunk of values, and what it adds to a :class:`ScanReport`.

Every reader (CSV, Parquet, NPY, tensors, datasets) turns its data into 2-D numpy blocks of
``rows × values`` and calls :meth:`Collector.feed` once per column or array per chunk. A clean
float block costs one ``abs`` and one ``max`` per value; only the columns whose maximum is NaN,
Inf or beyond float16 are looked at element by element.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ._result import FLOAT16_MAX, BadCell, BadRow, ColumnStats, ScanReport

__all__ = ["Collector", "Progress", "fmt_value"]


def fmt_value(v: Any) -> str:
    """A cell value as the report shows it: ``nan``, ``-inf``, ``1e+30``, ``''``."""
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.6g}"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, str):
        return repr(v)
    return str(v)  # complex


def _block_cell(vals: np.ndarray, r: int, j: int) -> str:
    return fmt_value(vals[r, j])


def _raw_cell(raw: Callable[[int, int], str] | None, start: int, r: int, j: int) -> str:
    return raw(r, start + j) if raw is not None else "''"


class Collector:
    """Counts per column and the first ``max_rows`` bad rows of one scan.

    Call :meth:`begin` with the first row index and the row count of a chunk, :meth:`feed` for
    each column or array of that chunk, then :meth:`end`.
    """

    def __init__(self, report: ScanReport, max_rows: int = 10, fp16: bool = False) -> None:
        self.report = report
        self.max_rows = max_rows
        self.fp16 = fp16
        self._rows: dict[int, BadRow] = {}
        self._row0 = 0
        self._mask: np.ndarray | None = None
        self._where: Callable[[int], str | None] | None = None

    # --- chunks ----------------------------------------------------------------------------------
    def begin(self, row0: int, n: int, where: Callable[[int], str | None] | None = None) -> None:
        self._row0 = row0
        self._mask = np.zeros(n, dtype=bool)
        self._where = where

    def end(self) -> None:
        if self._mask is not None:
            self.report.bad_row_count += int(self._mask.sum())
        self._mask = None

    def add_cells(self, rows: Sequence[int], cells: Sequence[BadCell]) -> None:
        """Record bad cells found outside :meth:`feed` (rows are absolute indices)."""
        for r, c in zip(rows, cells):
            self._add(int(r), c)
        self._trim()

    def finish(self) -> None:
        self.report.bad_rows = [self._rows[k] for k in sorted(self._rows)]

    # --- the check ---------------------------------------------------------------------------------
    def feed(
        self,
        cols: ColumnStats | Sequence[ColumnStats],
        block: np.ndarray,
        *,
        missing: np.ndarray | None = None,
        text: np.ndarray | None = None,
        raw: Callable[[int, int], str] | None = None,
        sample_shape: tuple[int, ...] | None = None,
    ) -> None:
        """Check ``block`` (``rows × k``) of this chunk.

        ``cols``: one :class:`ColumnStats` per column of the block, or a single one that covers
        all ``k`` values of a row (an array or tensor whose samples have ``sample_shape``; bad
        cells then name their position inside the sample). ``missing``/``text``: masks of the
        block's shape for cells that were empty or not a number (their values are ignored);
        ``raw(row, col)`` gives such a cell as it was read.

        The work per column is a few Python operations (the checks run on the whole block at
        once): a block of 200,000 columns costs about as much as one of 200,000 rows.
        """
        if block.ndim != 2:
            raise ValueError("feed() takes a 2-D block")
        n, k = block.shape
        if isinstance(cols, ColumnStats):
            cols.count += n * k
            groups = [cols]
            per_col = False
        else:
            if len(cols) != k:
                raise ValueError(f"{len(cols)} columns for a block of {k}")
            for c in cols:
                c.count += n
            groups = list(cols)
            per_col = True
        if n == 0 or k == 0:
            return
        for mask, kind in ((missing, "missing"), (text, "text")):
            if mask is not None and mask.any():
                self._masked(groups, per_col, mask, kind, raw, sample_shape)
        kind_ = block.dtype.kind
        if kind_ == "b" or kind_ not in "fciu":
            return
        if kind_ in "iu":
            filled = missing if missing is not None and missing.any() else None
            self._ints(self._slices(groups, per_col, k), block, sample_shape, filled)
            return
        if kind_ == "c":
            self._complex(self._slices(groups, per_col, k), block, sample_shape)
            return
        self._floats(groups, per_col, block, missing, text, sample_shape)

    @staticmethod
    def _slices(groups: list[ColumnStats], per_col: bool,
                k: int) -> list[tuple[ColumnStats, slice]]:
        if per_col:
            return [(c, slice(j, j + 1)) for j, c in enumerate(groups)]
        return [(groups[0], slice(0, k))]

    def _masked(self, groups: list[ColumnStats], per_col: bool, mask: np.ndarray, kind: str,
                raw: Callable[[int, int], str] | None, sample_shape: tuple[int, ...] | None) -> None:
        """Missing or text cells: counted per column, the first rows kept."""
        if not per_col:
            c = groups[0]
            setattr(c, kind, getattr(c, kind) + int(mask.sum()))
            self._cells(c, mask, kind, functools.partial(_raw_cell, raw, 0), sample_shape)
            return
        counts = mask.sum(axis=0)
        for j in np.flatnonzero(counts).tolist():
            c = groups[j]
            setattr(c, kind, getattr(c, kind) + int(counts[j]))
            self._cells(c, mask[:, j : j + 1], kind, functools.partial(_raw_cell, raw, j),
                        sample_shape)

    def _floats(self, groups: list[ColumnStats], per_col: bool, block: np.ndarray,
                missing: np.ndarray | None, text: np.ndarray | None,
                sample_shape: tuple[int, ...] | None) -> None:
        """One ``abs().max()`` per column decides; only the failing columns are looked at."""
        k = block.shape[1]
        limit = FLOAT16_MAX  # beyond it is counted always; it is a problem only under fp16
        # cells that were missing or text hold a filler value: left out of min/max
        excl = None
        if missing is not None and missing.any():
            excl = missing
        if text is not None and text.any():
            excl = text if excl is None else (excl | text)
        with np.errstate(invalid="ignore", over="ignore"):
            colmax = np.abs(block).max(axis=0)  # NaN propagates; Inf stays Inf
            ok = colmax <= limit
        mn = np.full(k, np.inf)
        mx = np.full(k, -np.inf)
        good = np.flatnonzero(ok)
        if good.size:
            sub = block[:, good] if good.size < k else block
            if excl is not None:
                ex = excl[:, good] if good.size < k else excl
                sub_lo, sub_hi = np.where(ex, np.inf, sub), np.where(ex, -np.inf, sub)
            else:
                sub_lo = sub_hi = sub
            mn[good] = sub_lo.min(axis=0)
            mx[good] = sub_hi.max(axis=0)
        if not per_col:
            c = groups[0]
            if ok.all():
                lo, hi = float(mn.min()), float(mx.max())
                if lo <= hi:  # else every cell of the group was missing
                    self._minmax(c, lo, hi)
            else:
                self._bad_floats(c, block, excl, sample_shape)
            return
        lows, highs = mn.tolist(), mx.tolist()
        for j, fine in enumerate(ok.tolist()):
            if fine:
                if lows[j] <= highs[j]:
                    self._minmax(groups[j], lows[j], highs[j])
            else:
                sl = slice(j, j + 1)
                self._bad_floats(groups[j], block[:, sl],
                                 None if excl is None else excl[:, sl], sample_shape)

    def _bad_floats(self, c: ColumnStats, vals: np.ndarray, excl: np.ndarray | None,
                    sample_shape: tuple[int, ...] | None) -> None:
        """Element by element, for a column whose maximum was NaN, Inf or beyond float16."""
        fin = np.isfinite(vals)
        if excl is not None:
            fin &= ~excl
        nan = np.isnan(vals)
        pinf = np.isposinf(vals)
        ninf = np.isneginf(vals)
        c.nan += int(nan.sum())
        c.posinf += int(pinf.sum())
        c.neginf += int(ninf.sum())
        if fin.any():
            fv = vals[fin]
            self._minmax(c, float(fv.min()), float(fv.max()))
        for m, kind in ((nan, "nan"), (pinf, "+inf"), (ninf, "-inf")):
            if m.any():
                self._cells(c, m, kind, functools.partial(_block_cell, vals), sample_shape)
        with np.errstate(invalid="ignore"):
            big = fin & (np.abs(vals) > FLOAT16_MAX)
        if big.any():
            c.fp16 += int(big.sum())
            self._fp16_cells(c, big, vals, sample_shape)

    # --- helpers -------------------------------------------------------------------------------
    def _fp16_cells(self, c: ColumnStats, big: np.ndarray, vals: np.ndarray,
                    sample_shape: tuple[int, ...] | None) -> None:
        """Rows beyond float16 are listed as bad rows only when float16 counts (``fp16=True``);
        otherwise they are counted, and said as information."""
        if self.fp16:
            self._cells(c, big, "fp16", functools.partial(_block_cell, vals), sample_shape)

    @staticmethod
    def _minmax(c: ColumnStats, lo: float, hi: float) -> None:
        c.min = lo if c.min is None else min(c.min, lo)
        c.max = hi if c.max is None else max(c.max, hi)

    def _ints(
        self, groups: list[tuple[ColumnStats, slice]], block: np.ndarray,
        sample_shape: tuple[int, ...] | None,
        filled: np.ndarray | None,
    ) -> None:
        if filled is None:
            mn, mx = block.min(axis=0), block.max(axis=0)
        else:  # nulls were filled with 0: leave them out
            info = np.iinfo(block.dtype)
            mn = np.where(filled, info.max, block).min(axis=0)
            mx = np.where(filled, info.min, block).max(axis=0)
        for c, sl in groups:
            lo, hi = float(mn[sl].min()), float(mx[sl].max())
            if lo > hi:
                continue  # every cell missing
            self._minmax(c, lo, hi)
            if hi > FLOAT16_MAX or lo < -FLOAT16_MAX:
                vals = block[:, sl]
                big = (vals > FLOAT16_MAX) | (vals < -FLOAT16_MAX)
                if filled is not None:
                    big &= ~filled[:, sl]
                c.fp16 += int(big.sum())
                self._fp16_cells(c, big, vals, sample_shape)

    def _complex(
        self, groups: list[tuple[ColumnStats, slice]], block: np.ndarray,
        sample_shape: tuple[int, ...] | None,
    ) -> None:
        for c, sl in groups:
            vals = block[:, sl]
            nan = np.isnan(vals)
            inf = np.isinf(vals) & ~nan
            c.nan += int(nan.sum())
            c.posinf += int(inf.sum())
            for m, kind in ((nan, "nan"), (inf, "+inf")):
                if m.any():
                    self._cells(c, m, kind, functools.partial(_block_cell, vals), sample_shape)

    def _cells(
        self,
        c: ColumnStats,
        mask: np.ndarray,
        kind: str,
        value: Callable[[int, int], str],
        sample_shape: tuple[int, ...] | None,
    ) -> None:
        rows_any = mask.any(axis=1)
        if self._mask is not None:
            self._mask |= rows_any
        rows = np.flatnonzero(rows_any)[: self.max_rows]
        if not rows.size:
            return
        for r in rows:
            j = int(np.flatnonzero(mask[r])[0])
            pos = None
            if sample_shape is not None and len(sample_shape) > 0:
                pos = "[" + ", ".join(str(int(i)) for i in np.unravel_index(j, sample_shape)) + "]"
            self._add(self._row0 + int(r), BadCell(c.name, kind, value(int(r), j), pos))
        self._trim()

    def _add(self, row: int, cell: BadCell) -> None:
        if len(self._rows) >= self.max_rows and row > max(self._rows):
            return
        b = self._rows.get(row)
        if b is None:
            where = self._where(row) if self._where is not None else None
            b = self._rows[row] = BadRow(row, where=where)
        if len(b.cells) < 16 and not any(x.column == cell.column and x.kind == cell.kind for x in b.cells):
            b.cells.append(cell)

    def _trim(self) -> None:
        while len(self._rows) > self.max_rows:
            del self._rows[max(self._rows)]


class Progress:
    """A rich progress bar on a terminal, nothing elsewhere (``enabled=False``)."""

    def __init__(self, enabled: bool, description: str, total: float | None, unit: str = "bytes") -> None:
        self._p: Any = None
        self._task: Any = None
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            MofNCompleteColumn,
            TaskProgressColumn,
            TextColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as RichProgress

        count = DownloadColumn() if unit == "bytes" else MofNCompleteColumn()
        self._p = RichProgress(
            TextColumn("[bold]{task.description}"), BarColumn(), TaskProgressColumn(), count,
            TimeRemainingColumn(), console=Console(stderr=True), transient=True,
        )
        self._p.start()
        self._task = self._p.add_task(description, total=total)

    def advance(self, n: float) -> None:
        if self._p is not None:
            self._p.advance(self._task, n)

    def close(self) -> None:
        if self._p is not None:
            self._p.stop()
            self._p = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
