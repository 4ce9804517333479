"""Tables: CSV (and TSV, compressed or not) and Parquet, read with pyarrow one batch at a time.

CSV cells are read as text (``pyarrow.csv.open_csv`` with every column typed ``string``, blocks
of ``chunk_bytes``), so a column is never guessed wrong from its first block. Per cell:

* empty or ``NA``-like (``NA``, ``N/A``, ``null``, ``None``, ``#N/A``, ...) → *missing*: pandas
  reads it as NaN, and so does every float tensor made from it;
* ``nan``, ``inf``, ``-Infinity``, or a number too large for float64 (``1e400``) → NaN/±Inf;
* anything else that is not a number → *text* — unless the whole column is text (labels, ids):
  such a column is listed as not checked.

Parquet columns keep their types: nulls are *missing*; numbers (also inside list columns, e.g.
embeddings) are checked; strings, dates and structs are not. Parquet is read with
``ParquetFile.iter_batches``: memory is bounded by the batch and by one row group's pages.
"""

from __future__ import annotations

import csv
import functools
import io
import itertools
import os
from collections.abc import Iterator
from typing import IO, Any

import numpy as np

from ._check import Collector, Progress
from ._result import BadCell, ColumnStats, ScanReport

__all__ = ["scan_csv", "scan_parquet", "scan_table"]

_BLOCK = 4 << 20  # arrow parses a piece in blocks of this size, on its threads
_MISSING = ["", "na", "n/a", "nan/a", "null", "none", "#n/a", "#n/a n/a", "#na", "<na>", "nil",
            "-1.#ind", "1.#ind", "-1.#qnan", "1.#qnan", "missing", "?"]
_NUMBER = r"^[+-]?((\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|nan|inf|infinity)$"


def _pyarrow() -> Any:
    try:
        import pyarrow
    except ImportError as exc:
        raise ImportError(
            "nanguard scan reads CSV and Parquet with pyarrow: pip install 'nanguard[data]' "
            "(or: pip install pyarrow)"
        ) from exc
    return pyarrow


def _open(path: str) -> tuple[IO[bytes], Any]:
    """``(raw file, decompressed stream)``: the raw file's position measures progress."""
    raw = open(path, "rb")  # noqa: SIM115 (closed by the caller)
    low = path.lower()
    if low.endswith(".gz"):
        import gzip

        return raw, gzip.GzipFile(fileobj=raw, mode="rb")
    if low.endswith(".bz2"):
        import bz2

        return raw, bz2.BZ2File(raw, mode="rb")
    if low.endswith((".zst", ".lz4")):
        import pyarrow as pa

        codec = "zstd" if low.endswith(".zst") else "lz4"
        return raw, pa.CompressedInputStream(pa.PythonFile(raw, mode="r"), codec)
    return raw, raw


def _pieces(stream: IO[bytes], chunk_bytes: int) -> Iterator[bytes | memoryview]:
    """The stream cut into pieces of about ``chunk_bytes`` that end at a line end outside any
    quoted field (RFC 4180 doubles quotes inside quotes, so an even count of ``"`` before a
    newline means it ends a record). One piece is in memory at a time (arrow's own streaming
    CSV reader reads ahead without bound on a fast disk)."""
    rest = b""
    while True:
        data = stream.read(chunk_bytes)
        if not data:
            if rest:
                yield rest
            return
        buf = rest + data if rest else data
        del data
        cut = buf.rfind(b"\n")
        while cut >= 0 and buf.count(b'"', 0, cut) % 2:
            cut = buf.rfind(b"\n", 0, cut)
        if cut < 0:
            rest = buf  # one record longer than a chunk (or a long quoted field): read on
            continue
        rest = buf[cut + 1 :]
        yield memoryview(buf)[: cut + 1]  # no copy: arrow reads the buffer in place
        del buf


def _split_header(first: bytes | memoryview) -> tuple[bytes, bytes | memoryview]:
    """The header line and the rest of the first piece."""
    first = bytes(first)
    if first.startswith(b"\xef\xbb\xbf"):
        first = first[3:]
    pos = first.find(b"\n")
    while pos >= 0 and first.count(b'"', 0, pos) % 2:
        pos = first.find(b"\n", pos + 1)
    if pos < 0:
        return first, b""
    return first[: pos + 1], first[pos + 1 :]


class _Pending:
    """Missing and text cells of a column with no number yet: a label column is no problem."""

    def __init__(self) -> None:
        self.text = 0
        self.missing = 0
        self.rows: list[int] = []
        self.cells: list[BadCell] = []

    def keep(self, miss: np.ndarray, text: np.ndarray, row0: int, name: str, raw: Any,
             limit: int) -> None:
        for r in np.flatnonzero(miss | text)[: max(0, limit - len(self.rows))]:
            self.rows.append(row0 + int(r))
            self.cells.append(BadCell(name, "text" if text[r] else "missing", raw(int(r), 0)))


def _guess_delimiter(header: bytes) -> str:
    """The separator of the header row, by :class:`csv.Sniffer` among ``,``, ``;`` (the CSV of
    locales with a decimal comma), tab and ``|``; ``,`` when it cannot tell."""
    try:
        return csv.Sniffer().sniff(header.decode("utf-8", "replace"), delimiters=",;\t|").delimiter
    except csv.Error:
        return ","


def scan_csv(
    path: str, report: ScanReport, col: Collector, chunk_bytes: int, progress: bool,
    delimiter: str | None = None,
) -> None:
    pa = _pyarrow()
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    low = path.lower()
    report.unit = "row"
    report.nbytes = os.path.getsize(path)
    raw_file, stream = _open(path)
    with raw_file, Progress(progress, os.path.basename(path), report.nbytes) as bar:
        pieces = _pieces(stream, chunk_bytes)
        head, first = _split_header(next(pieces, b""))
        if delimiter is None:
            delimiter = "\t" if ".tsv" in low or ".tab" in low else _guess_delimiter(head)
            if delimiter not in ",\t":
                report.notes.append(f"cells separated by {delimiter!r} (guessed from the header row)")
        report.format = "TSV" if delimiter == "\t" else "CSV"
        names = next(csv.reader(io.StringIO(head.decode("utf-8", "replace")), delimiter=delimiter), [])
        if not names:
            raise ValueError("empty file: no header row")
        uniq = [n if names.count(n) == 1 else f"{n}#{i}" for i, n in enumerate(names)]
        cols = [ColumnStats(n, "") for n in uniq]
        report.columns = cols
        numeric_seen = [0] * len(cols)
        pending = [_Pending() for _ in cols]
        opts = {
            "read_options": pacsv.ReadOptions(column_names=uniq, block_size=_BLOCK),
            "parse_options": pacsv.ParseOptions(delimiter=delimiter, newlines_in_values=True),
            "convert_options": pacsv.ConvertOptions(
                column_types={n: pa.string() for n in uniq}, strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        }
        missing_set = pa.array(_MISSING)
        row0 = 0
        done = 0
        for piece in itertools.chain([first], pieces):
            if not len(piece):
                continue
            try:
                table = pacsv.read_csv(pa.BufferReader(piece), **opts)
            except pa.ArrowInvalid as exc:
                raise ValueError(f"not a well-formed CSV after data row {row0}: {exc}") from None
            del piece
            n = table.num_rows
            col.begin(row0, n)
            for j, c in enumerate(cols):
                arr = table.column(j).combine_chunks()
                trimmed = pc.utf8_trim_whitespace(arr)
                miss = pc.is_in(pc.utf8_lower(trimmed), value_set=missing_set)
                isnum = pc.and_(pc.invert(miss),
                                pc.match_substring_regex(trimmed, _NUMBER, ignore_case=True))
                nums = pc.cast(pc.if_else(isnum, trimmed, pa.scalar(None, pa.string())), pa.float64())
                values = pc.fill_null(nums, 0.0).to_numpy(zero_copy_only=False).reshape(n, 1)
                miss_np = miss.to_numpy(zero_copy_only=False).reshape(n, 1)
                text_np = ~(miss_np | isnum.to_numpy(zero_copy_only=False).reshape(n, 1))
                numeric_seen[j] += int(n - miss_np.sum() - text_np.sum())
                raw = functools.partial(_cell, arr)
                p = pending[j]
                if numeric_seen[j] == 0:
                    # no number in this column yet: maybe labels; keep the evidence aside
                    p.text += int(text_np.sum())
                    p.missing += int(miss_np.sum())
                    p.keep(miss_np[:, 0], text_np[:, 0], row0, c.name, raw, col.max_rows)
                    col.feed([c], values)
                    continue
                if p.rows or p.text or p.missing:
                    _flush(c, p, col)
                    pending[j] = _Pending()
                col.feed([c], values, missing=miss_np, text=text_np, raw=raw)
            col.end()
            del table
            row0 += n
            pos = raw_file.tell()  # bytes of the file read so far (compressed, if it is)
            bar.advance(pos - done)
            done = pos
    report.rows = row0
    for c, seen, p in zip(cols, numeric_seen, pending):
        c.dtype = "number" if seen else ("text" if p.text else "empty")
        if seen == 0 and p.text:
            c.skipped = "text column"  # labels or ids: never turned into a float tensor as is
        elif p.rows or p.missing:
            _flush(c, p, col)  # an empty column: all missing


def _cell(arr: Any, r: int, _k: int) -> str:
    """A CSV cell as it was read (for the report)."""
    return repr(arr[r].as_py())


def _flush(c: ColumnStats, p: _Pending, col: Collector) -> None:
    c.text += p.text
    c.missing += p.missing
    col.add_cells(p.rows, p.cells)
    col.report.bad_row_count += max(p.text + p.missing, 0)  # these rows were not counted yet


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
