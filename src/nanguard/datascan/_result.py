"""What a scan found: counts per column or tensor, the first bad rows, and their rendering."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..core.ops import DTYPE_MAX

if TYPE_CHECKING:
    from rich.console import RenderableType

__all__ = ["FLOAT16_MAX", "BadCell", "BadRow", "ColumnStats", "ScanError", "ScanReport", "format_report"]

#: the largest finite float16; a value beyond it becomes ±Inf (or is rounded down to it, up to
#: 65520) when the data is cast to float16 — counted as "beyond float16"
FLOAT16_MAX = DTYPE_MAX["float16"]

class ScanError(ValueError):
    """A file that cannot be read as the format it claims (empty, truncated, corrupt, binary data
    in a CSV, Python objects where tensors were expected). The message says what is wrong with
    it; ``nanguard scan`` prints it as one line and goes on with the other files."""


#: ``ColumnStats.skipped`` of an array that holds Python objects: it could not be checked
UNREADABLE = "Python objects, never unpickled"

#: issue kinds, as they appear in ``BadCell.kind``
KINDS = ("nan", "+inf", "-inf", "missing", "text", "fp16")


@dataclass
class ColumnStats:
    """Counts for one column (CSV, Parquet), feature (2-D array), array or tensor.

    ``count`` is the number of values (cells, elements) scanned; ``missing``: empty or ``NA``-like
    cells and nulls (they become NaN when the data turns into a float tensor); ``text``: cells of a
    numeric column that do not parse as a number; ``fp16``: finite values with ``|x| > 65504``.
    ``min``/``max`` are over the finite values.
    """

    name: str
    dtype: str
    count: int = 0
    nan: int = 0
    posinf: int = 0
    neginf: int = 0
    missing: int = 0
    text: int = 0
    fp16: int = 0
    min: float | None = None
    max: float | None = None
    skipped: str | None = None  # why the column was not checked ("text column", ...)

    def issues(self, fp16: bool = True) -> int:
        n = self.nan + self.posinf + self.neginf + self.missing + self.text
        return n + (self.fp16 if fp16 else 0)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("min", "max"):
            if d[k] is not None and not math.isfinite(d[k]):
                d[k] = None
        return d


@dataclass
class BadCell:
    column: str
    kind: str  # one of KINDS
    value: str  # as read, e.g. "nan", "''", "1e+30"
    position: str | None = None  # inside a multi-dimensional sample: "[2, 0, 17]"


@dataclass
class BadRow:
    """One row (CSV/Parquet), sample (axis 0 of an array, a dataset item) with problems."""

    index: int
    cells: list[BadCell] = field(default_factory=list)
    where: str | None = None  # for a DataLoader: "batch 3, item 5"


@dataclass
class ScanReport:
    """The result of :func:`nanguard.scan`. ``found`` says whether anything was found.

    ``unit`` names what ``rows`` counts (``"row"``, ``"sample"``); ``bad_rows`` holds the first
    ``max_rows`` rows or samples with a problem, in order.
    """

    source: str
    format: str
    rows: int = 0
    unit: str = "row"
    columns: list[ColumnStats] = field(default_factory=list)
    bad_rows: list[BadRow] = field(default_factory=list)
    bad_row_count: int = 0
    nbytes: int | None = None
    seconds: float = 0.0
    chunk_bytes: int = 0
    fp16: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def found(self) -> bool:
        return any(c.issues(self.fp16) for c in self.columns)

    @property
    def unchecked(self) -> list[str]:
        """Arrays or tensors that could not be checked (Python objects, never unpickled): their
        values are unknown, so the scan is not complete."""
        return [c.name for c in self.columns if c.skipped == UNREADABLE]

    @property
    def complete(self) -> bool:
        return not self.unchecked

    @property
    def clean(self) -> bool:
        """Nothing found, and everything checked."""
        return not self.found and self.complete

    def totals(self) -> dict[str, int]:
        keys = ("nan", "posinf", "neginf", "missing", "text", "fp16")
        return {k: sum(getattr(c, k) for c in self.columns) for k in keys}

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "format": self.format,
            "found": self.found,
            "complete": self.complete,
            "rows": self.rows,
            "unit": self.unit,
            "bytes": self.nbytes,
            "seconds": round(self.seconds, 3),
            "chunk_bytes": self.chunk_bytes,
            "fp16_checked": self.fp16,  # whether values beyond float16 count as found
            "totals": self.totals(),
            "bad_row_count": self.bad_row_count,
            "columns": [c.to_dict() for c in self.columns],
            "bad_rows": [asdict(r) for r in self.bad_rows],
            "notes": list(self.notes),
        }

    def __str__(self) -> str:
        return format_report(self)

    def __rich__(self) -> RenderableType:
        return report_table(self)


# ----------------------------------------------------------------------------------------------
# rendering


def _size(n: int | None) -> str:
    if n is None:
        return ""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n = n / 1024  # type: ignore[assignment]
    return ""


def _g(x: float | None) -> str:
    return "" if x is None else f"{x:.4g}"


def _n(count: int, word: str) -> str:
    """``1 column``, ``3 columns``, ``2 tensors/fields``."""
    if count == 1:
        word = word.replace("columns", "column").replace("tensors/fields", "tensor/field")
        word = word.replace("rows", "row").replace("samples", "sample").replace("groups", "group")
    return f"{count:,} {word}"


def _what(r: ScanReport) -> str:
    return "columns" if r.unit == "row" else "tensors/fields"


def _found_words(r: ScanReport) -> str:
    t = r.totals()
    parts = []
    for key, word in (("nan", "NaN"), ("posinf", "+Inf"), ("neginf", "-Inf"),
                      ("missing", "missing/empty"), ("text", "non-numeric")):
        if t[key]:
            parts.append(f"{t[key]:,} {word}")
    if r.fp16 and t["fp16"]:
        parts.append(f"{t['fp16']:,} beyond float16 (|x| > 65504)")
    bad_cols = sum(1 for c in r.columns if c.issues(r.fp16))
    checked = sum(1 for c in r.columns if c.skipped is None)
    return f"{', '.join(parts)} in {bad_cols} of {_n(checked, _what(r))}"


def _header(r: ScanReport) -> str:
    checked = [c for c in r.columns if c.skipped is None]
    bits = [r.format, _n(r.rows, r.unit + "s"), _n(len(checked), _what(r)) + " checked"]
    if r.nbytes is not None:
        bits.append(_size(r.nbytes))
    bits.append(f"{r.seconds:.2f} s")
    return f"{r.source}: {', '.join(bits)}"


_HEAD = ("column", "dtype", "values", "NaN", "+Inf", "-Inf", "missing", "text", ">fp16", "min", "max")


def _row(c: ColumnStats) -> list[str]:
    return [c.name, c.dtype, f"{c.count:,}", f"{c.nan:,}", f"{c.posinf:,}", f"{c.neginf:,}",
            f"{c.missing:,}", f"{c.text:,}", f"{c.fp16:,}", _g(c.min), _g(c.max)]


def _describe_row(b: BadRow) -> str:
    cells = []
    for c in b.cells[:6]:
        pos = c.position or ""
        cells.append(f"{c.column}{pos}={c.value} ({_KIND_WORDS.get(c.kind, c.kind)})")
    more = f", +{len(b.cells) - 6} more" if len(b.cells) > 6 else ""
    where = f" [{b.where}]" if b.where else ""
    return "; ".join(cells) + more + where


_KIND_WORDS = {"nan": "NaN", "+inf": "+Inf", "-inf": "-Inf", "missing": "missing",
               "text": "not a number", "fp16": "beyond float16"}


def _verdict(r: ScanReport) -> str:
    """The line under the header of a report with nothing found."""
    if r.complete:
        return "clean: no NaN/Inf, no missing or non-numeric cells" + (
            ", nothing beyond float16" if r.fp16 else "")
    names = ", ".join(r.unchecked[:8]) + (f", +{len(r.unchecked) - 8} more" if len(r.unchecked) > 8 else "")
    return (f"not all checked: nothing found in what could be read, but {names} holds Python "
            "objects (a pickle), which nanguard never loads; save numbers instead (np.savez with "
            "numeric arrays)")


def _fp16_info(r: ScanReport) -> str | None:
    """Values beyond float16 when they do not count as a problem (the default): information."""
    n = r.totals()["fp16"]
    if r.fp16 or not n:
        return None
    cols = [c.name for c in r.columns if c.fp16]
    names = ", ".join(cols[:4]) + (f", +{len(cols) - 4} more" if len(cols) > 4 else "")
    return (f"{n:,} finite value{'s' if n != 1 else ''} beyond float16 (|x| > 65504) in {names}: "
            "fine in float32, Inf if cast to float16 (--fp16 / fp16=True counts them)")


def format_report(r: ScanReport, max_columns: int = 30) -> str:
    """Plain text: a header, the columns with problems, the first bad rows."""
    lines = [_header(r)]
    if not r.found:
        lines.append("  " + _verdict(r))
    else:
        lines.append(f"  found: {_found_words(r)}")
        bad = [c for c in r.columns if c.issues(r.fp16)]
        rows = [list(_HEAD)] + [_row(c) for c in bad[:max_columns]]
        widths = [max(len(row[i]) for row in rows) for i in range(len(_HEAD))]
        lines.append("")
        for row in rows:
            cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])]
            cells += [v.rjust(w) for v, w in zip(row[2:], widths[2:])]
            lines.append("  " + "  ".join(cells).rstrip())
        if len(bad) > max_columns:
            lines.append(f"  ... {len(bad) - max_columns} more columns with problems")
        clean = sum(1 for c in r.columns if not c.issues(r.fp16) and c.skipped is None)
        if clean:
            lines.append(f"  ({_n(clean, 'clean ' + _what(r))} not shown)")
        if r.bad_rows:
            n = r.bad_row_count
            lines += ["", f"  first bad {r.unit}s ({len(r.bad_rows)} of {n:,}; {r.unit}s count from 0):"]
            for b in r.bad_rows:
                lines.append(f"    {r.unit} {b.index}: {_describe_row(b)}")
    skipped = [c for c in r.columns if c.skipped]
    if skipped:
        names = ", ".join(f"{c.name} ({c.skipped})" for c in skipped[:8])
        more = f", +{len(skipped) - 8} more" if len(skipped) > 8 else ""
        lines.append(f"  not checked: {names}{more}")
    info = _fp16_info(r)
    if info:
        lines.append(f"  info: {info}")
    lines += [f"  note: {n}" for n in r.notes]
    return "\n".join(lines)


def report_table(r: ScanReport) -> RenderableType:
    """The same content as :func:`format_report`, as rich renderables for a terminal."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[RenderableType] = [Text(_header(r), style="bold")]
    if not r.found:
        parts.append(Text("  " + _verdict(r), style="green" if r.complete else "yellow"))
    else:
        parts.append(Text.assemble(("  found: ", "bold red"), _found_words(r)))
        table = Table(box=None, padding=(0, 1), header_style="bold cyan")
        for i, h in enumerate(_HEAD):
            table.add_column(h, justify="left" if i < 2 else "right", no_wrap=i == 0)
        for c in [c for c in r.columns if c.issues(r.fp16)][:30]:
            cells = _row(c)
            table.add_row(*[Text(v, style="red" if i >= 3 and i <= 8 and v != "0" else "")
                            for i, v in enumerate(cells)])
        parts.append(table)
        if r.bad_rows:
            parts.append(Text(f"first bad {r.unit}s ({len(r.bad_rows)} of {r.bad_row_count:,}; "
                              f"{r.unit}s count from 0):",
                              style="bold"))
            for b in r.bad_rows:
                parts.append(Text(f"  {r.unit} {b.index}: {_describe_row(b)}"))
    skipped = [c for c in r.columns if c.skipped]
    if skipped:
        parts.append(Text("not checked: " + ", ".join(f"{c.name} ({c.skipped})" for c in skipped[:8]),
                          style="dim"))
    info = _fp16_info(r)
    if info:
        parts.append(Text(f"info: {info}", style="dim"))
    parts += [Text(f"note: {n}", style="dim") for n in r.notes]
    return Group(*parts)
