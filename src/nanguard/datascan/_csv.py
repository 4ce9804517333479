"""CSV and TSV files (also ``.gz``, ``.bz2``, ``.zst``), streamed in pieces of ``chunk_bytes``.

The file is cut into pieces that end at a record end; each piece is parsed into text cells and
every cell of the piece is classified in one vectorised pass (``pyarrow.compute`` over all its
cells, not column by column), so the time is linear in the number of cells, whatever the shape:
a 2-row file of 200,000 columns costs what a 200,000-row file of 2 columns costs. Per cell:

* empty or ``NA``-like (``NA``, ``N/A``, ``null``, ``None``, ``#N/A``, ...) → *missing*: pandas
  reads it as NaN, and so does every float tensor made from it;
* ``nan``, ``inf``, ``-Infinity``, or a number too large for float64 (``1e400``) → NaN/±Inf;
* anything else that is not a number → *text* — unless the whole column is text (labels, ids):
  such a column is listed as not checked.

Pieces are parsed by ``pyarrow.csv`` (fast on long files) up to :data:`WIDE` columns, and by
Python's :mod:`csv` beyond: arrow's reader costs grow faster than linearly in the number of
columns (measured: 0.6 s for 2 rows of 20,000 columns, 15.6 s for 200,000).
"""

from __future__ import annotations

import csv
import io
import os
from collections import Counter
from collections.abc import Iterator
from typing import IO, Any, NamedTuple

import numpy as np

from ._check import Collector, Progress
from ._result import BadCell, ColumnStats, ScanError, ScanReport

__all__ = ["WIDE", "scan_csv"]

#: from this many columns on, pieces are parsed with Python's csv module instead of pyarrow's
WIDE = 4096
_BLOCK = 4 << 20  # arrow parses a piece in blocks of this size, on its threads
_MISSING = ["", "na", "n/a", "nan/a", "null", "none", "#n/a", "#n/a n/a", "#na", "<na>", "nil",
            "-1.#ind", "1.#ind", "-1.#qnan", "1.#qnan", "missing", "?"]
_NUMBER = r"^[+-]?((\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|nan|inf|infinity)$"
#: pending cells (of columns with no number yet) kept in all, for the first-bad-rows listing
_PENDING_CELLS = 100_000


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
    CSV reader reads ahead without bound on a fast disk). A NUL byte means binary data."""
    rest = b""
    done = 0
    while True:
        data = stream.read(chunk_bytes)
        if not data:
            if rest:
                yield rest
            return
        nul = data.find(b"\x00")
        if nul >= 0:
            raise ScanError(f"binary data (a NUL byte at byte {done + nul:,} of the text): not a "
                             "text CSV file (a UTF-16 export? save it as UTF-8)")
        done += len(data)
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


def _guess_delimiter(header: bytes) -> str:
    """The separator of the header row, by :class:`csv.Sniffer` among ``,``, ``;`` (the CSV of
    locales with a decimal comma), tab and ``|``; ``,`` when it cannot tell."""
    try:
        sample = header[: 1 << 16].decode("utf-8", "replace")  # enough to tell, in bounded time
        return csv.Sniffer().sniff(sample, delimiters=",;\t|").delimiter
    except csv.Error:
        return ","


def _header_names(head: bytes, delimiter: str) -> list[str]:
    try:
        names = next(csv.reader(io.StringIO(head.decode("utf-8", "replace"), newline=""),
                                delimiter=delimiter), [])
    except csv.Error as exc:
        raise ScanError(f"the header row is not CSV ({exc})") from None
    if not names:
        raise ScanError("empty file: no header row")
    counts = Counter(names)
    return [n if counts[n] == 1 else f"{n}#{i}" for i, n in enumerate(names)]


# ----------------------------------------------------------------------------------------------
# one piece: parsed into cells, the cells classified


class _Cells(NamedTuple):
    """The text cells of one piece (or of a group of its columns), column after column:
    ``cells[j * n + r]`` is row ``r`` of column ``j0 + j``."""

    n: int
    k: int
    cells: Any  # a pyarrow (chunked) string array of n × k cells
    j0: int = 0

    def raw(self, r: int, j: int) -> str:
        return repr(self.cells[j * self.n + r].as_py())

    def groups(self) -> Iterator[_Cells]:
        """Groups of whole columns of at most :data:`_SLICE` cells (one column at least): the
        temporaries of the checks stay bounded, and a wide piece is still one group."""
        per = max(1, _SLICE // max(1, self.n))
        for j0 in range(0, self.k, per):
            k = min(per, self.k - j0)
            yield _Cells(self.n, k, self.cells.slice(j0 * self.n, k * self.n), self.j0 + j0)

    def grid(self, flat: np.ndarray) -> np.ndarray:
        """A flat per-cell array as ``rows × columns``."""
        return flat.reshape(self.k, self.n).T


def _parse_arrow(piece: bytes | memoryview, names: list[str], delimiter: str, row0: int) -> _Cells:
    pa = _pyarrow()
    import pyarrow.csv as pacsv

    def read(block: int) -> Any:
        return pacsv.read_csv(
            pa.BufferReader(piece),
            read_options=pacsv.ReadOptions(column_names=names, block_size=block),
            parse_options=pacsv.ParseOptions(delimiter=delimiter, newlines_in_values=True),
            convert_options=pacsv.ConvertOptions(
                column_types={n: pa.string() for n in names}, strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        )

    try:
        try:
            table = read(_BLOCK)
        except pa.ArrowInvalid as exc:
            if "straddl" not in str(exc) or len(piece) < _BLOCK:
                raise
            table = read(len(piece) + 1)  # a record longer than arrow's block: one block
    except pa.ArrowInvalid as exc:
        raise ScanError(f"not a well-formed CSV after data row {row0}: {exc}") from None
    # the columns one after the other, without a copy (the chunks stay the table's)
    chunks = [ch for column in table.columns for ch in column.chunks]
    return _Cells(table.num_rows, len(names), pa.chunked_array(chunks, type=pa.string()))


def _parse_python(piece: bytes | memoryview, k: int, delimiter: str, row0: int) -> _Cells:
    pa = _pyarrow()
    try:
        text = bytes(piece).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScanError(f"not UTF-8 text after data row {row0}: {exc}") from None
    rows: list[list[str]] = []
    old = csv.field_size_limit()
    csv.field_size_limit(max(old, len(text) + 1))  # one cell may be the whole piece
    try:
        for row in csv.reader(io.StringIO(text, newline=""), delimiter=delimiter):
            if not row:
                continue  # an empty line, skipped as arrow skips it
            if len(row) != k:
                raise ScanError(f"not a well-formed CSV: data row {row0 + len(rows)} has "
                                 f"{len(row)} fields, the header {k}")
            rows.append(row)
    except csv.Error as exc:
        raise ScanError(f"not a well-formed CSV after data row {row0 + len(rows)}: {exc}") from None
    finally:
        csv.field_size_limit(old)
    by_column = [row[j] for j in range(k) for row in rows]
    return _Cells(len(rows), k, pa.array(by_column, pa.string()))


#: cells classified by one set of compute calls: bounds the temporary copies of the text
_SLICE = 1 << 17


def _classify(c: _Cells) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(values, missing, text)`` of a group, each ``rows × columns``: the number in each
    cell (0 where there is none), and the masks of missing and non-numeric cells."""
    pa = _pyarrow()
    import pyarrow.compute as pc

    trimmed = pc.utf8_trim_whitespace(c.cells)
    miss = pc.is_in(pc.utf8_lower(trimmed), value_set=pa.array(_MISSING))
    isnum = pc.and_(pc.invert(miss), pc.match_substring_regex(trimmed, _NUMBER, ignore_case=True))
    nums = pc.cast(pc.if_else(isnum, trimmed, pa.scalar(None, pa.string())), pa.float64())
    values = pc.fill_null(nums, 0.0).to_numpy(zero_copy_only=False)
    miss_np = miss.to_numpy(zero_copy_only=False)
    text_np = ~(miss_np | isnum.to_numpy(zero_copy_only=False))
    return c.grid(values), c.grid(miss_np), c.grid(text_np)


# ----------------------------------------------------------------------------------------------
# the columns over the whole file


class _Columns:
    """Per-column state across pieces. A column with no number yet may hold labels: its missing
    and text cells are counted aside (*pending*), and become problems only once a number shows
    up in it; a column that never gets one is a text column (not checked)."""

    def __init__(self, names: list[str], col: Collector) -> None:
        self.cols = [ColumnStats(n, "") for n in names]
        self.col = col
        k = len(names)
        self.numeric = np.zeros(k, dtype=np.int64)
        self.pend_text = np.zeros(k, dtype=np.int64)
        self.pend_missing = np.zeros(k, dtype=np.int64)
        self.pend_cells: dict[int, list[tuple[int, BadCell]]] = {}
        self._kept = 0

    def feed(self, row0: int, cells: _Cells) -> None:
        for group in cells.groups():
            self._feed_group(row0, group)

    def _feed_group(self, row0: int, g: _Cells) -> None:
        values, miss, text = _classify(g)
        j0, j1 = g.j0, g.j0 + g.k
        before = self.numeric[j0:j1] > 0
        self.numeric[j0:j1] += g.n - miss.sum(axis=0) - text.sum(axis=0)
        now = self.numeric[j0:j1] > 0
        still = np.flatnonzero(~now)
        if still.size:
            self._hold(still, miss, text, row0, g)
        pending = (self.pend_text[j0:j1] > 0) | (self.pend_missing[j0:j1] > 0)
        for j in np.flatnonzero(now & ~before & pending).tolist():
            self._flush(j0 + j)
        fed = np.flatnonzero(now)
        if not fed.size:
            return
        if fed.size == g.k:
            self.col.feed(self.cols[j0:j1], values, missing=miss, text=text, raw=g.raw)
            return
        idx = fed.tolist()
        self.col.feed([self.cols[j0 + j] for j in idx], values[:, fed], missing=miss[:, fed],
                      text=text[:, fed], raw=lambda r, j: g.raw(r, idx[j]))

    def _hold(self, still: np.ndarray, miss: np.ndarray, text: np.ndarray, row0: int,
              g: _Cells) -> None:
        """Columns ``g.j0 + still`` have no number yet: their missing and text cells aside."""
        n = miss.shape[0]
        m, t = miss[:, still], text[:, still]
        self.pend_missing[g.j0 + still] += m.sum(axis=0)
        self.pend_text[g.j0 + still] += t.sum(axis=0)
        limit = self.col.max_rows
        for i, jj in enumerate(still.tolist()):
            j = g.j0 + jj
            self.cols[j].count += n
            kept = self.pend_cells.get(j, [])
            if len(kept) >= limit or self._kept >= _PENDING_CELLS:
                continue
            bad = np.flatnonzero(m[:, i] | t[:, i])
            if bad.size:
                self.pend_cells[j] = kept
            for r in bad[: limit - len(kept)].tolist():
                kind = "text" if t[r, i] else "missing"
                kept.append((row0 + r, BadCell(self.cols[j].name, kind, g.raw(r, jj))))
                self._kept += 1

    def _flush(self, j: int) -> None:
        c = self.cols[j]
        kept = self.pend_cells.pop(j, [])
        c.text += int(self.pend_text[j])
        c.missing += int(self.pend_missing[j])
        self.col.add_cells([r for r, _ in kept], [cell for _, cell in kept])
        # these rows were not counted yet
        self.col.report.bad_row_count += int(self.pend_text[j] + self.pend_missing[j])
        self.pend_text[j] = self.pend_missing[j] = 0

    def finish(self) -> None:
        seen = (self.numeric > 0).tolist()
        has_text = (self.pend_text > 0).tolist()
        for j, c in enumerate(self.cols):
            c.dtype = "number" if seen[j] else ("text" if has_text[j] else "empty")
        for j in np.flatnonzero(self.pend_text > 0).tolist():
            self.cols[j].skipped = "text column"  # labels or ids: never a float tensor as is
        for j in np.flatnonzero((self.pend_text == 0) & (self.pend_missing > 0)).tolist():
            self._flush(j)  # an empty column: all missing


def scan_csv(
    path: str, report: ScanReport, col: Collector, chunk_bytes: int, progress: bool,
    delimiter: str | None = None,
) -> None:
    _pyarrow()
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
        names = _header_names(head, delimiter)
        columns = _Columns(names, col)
        report.columns = columns.cols
        wide = len(names) >= WIDE
        row0 = done = 0
        for piece in _chain(first, pieces):
            cells = (_parse_python(piece, len(names), delimiter, row0) if wide
                     else _parse_arrow(piece, names, delimiter, row0))
            del piece
            col.begin(row0, cells.n)
            columns.feed(row0, cells)
            col.end()
            row0 += cells.n
            del cells  # before the next piece is parsed: one piece's table at a time
            pos = raw_file.tell()  # bytes of the file read so far (compressed, if it is)
            bar.advance(pos - done)
            done = pos
    report.rows = row0
    columns.finish()


def _chain(first: bytes | memoryview, rest: Iterator[bytes | memoryview]) -> Iterator[bytes | memoryview]:
    if len(first):
        yield first
    for piece in rest:
        if len(piece):
            yield piece

