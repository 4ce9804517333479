"""Find what turns into NaN/Inf before training starts: ``nanguard.scan(obj)`` / ``nanguard scan``.

Run it on the data *before* a run (or when a finding says ``nonfinite-input``). It finds

* NaN and ±Inf values;
* empty or missing cells and nulls — they become NaN when the data turns into a float tensor;
* cells of a numeric column that are not numbers;
* finite values beyond the float16 range (``|x| > 65504``), which overflow under ``fp16``
  autocast or ``.half()`` (counted as found with ``fp16=True``; otherwise said as information);

in CSV/TSV, Parquet, NPY/NPZ, ``.pt``/``.pth`` and safetensors files, in numpy arrays, torch
tensors, pyarrow tables and pandas data frames, and in a ``torch.utils.data.Dataset`` or
``DataLoader``. It counts them per column (or feature, tensor, field) and lists the first bad rows.

Files are streamed in chunks of ``chunk_bytes`` (default 16 MiB): the extra memory a scan needs
is a few times that (about 4×, ~130 MB at the default) whatever the file size — except NPZ
members and ``.pt`` files in the legacy (non-zip) format, see ``docs/scan.md``.
"""

from __future__ import annotations

import os
import sys
import time
import zipfile
from collections.abc import Mapping
from typing import Any

import numpy as np

from ._check import Collector
from ._result import (
    FLOAT16_MAX,
    BadCell,
    BadRow,
    ColumnStats,
    ScanError,
    ScanReport,
    format_report,
)

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "FLOAT16_MAX",
    "SUFFIXES",
    "BadCell",
    "BadRow",
    "ColumnStats",
    "ScanError",
    "ScanReport",
    "format_report",
    "scan",
]

#: bytes of raw data read per chunk: the bound on a scan's working memory (a few times this)
DEFAULT_CHUNK_BYTES = 16 << 20

#: file suffixes ``scan`` reads, and the format each means
SUFFIXES = {
    ".csv": "csv", ".tsv": "csv", ".tab": "csv", ".csv.gz": "csv", ".tsv.gz": "csv",
    ".csv.bz2": "csv", ".csv.zst": "csv",
    ".parquet": "parquet", ".pq": "parquet",
    ".npy": "npy", ".npz": "npz",
    ".pt": "pt", ".pth": "pt",
    ".safetensors": "safetensors",
}


def file_format(path: str) -> str | None:
    """The format of ``path`` from its suffix (``"csv"``, ``"parquet"``, ...), or ``None``."""
    low = path.lower()
    for suffix in sorted(SUFFIXES, key=len, reverse=True):
        if low.endswith(suffix):
            return SUFFIXES[suffix]
    return None


def scan(
    obj: Any,
    *,
    max_rows: int = 10,
    fp16: bool = False,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    progress: bool = False,
    format: str | None = None,
    max_samples: int | None = None,
) -> ScanReport:
    """Scan a file, an array/tensor/table, or a dataset for values that become NaN/Inf.

    ``obj``: a path (CSV/TSV, Parquet, NPY, NPZ, ``.pt``/``.pth``, safetensors — by suffix, or
    ``format=``), a numpy array, a torch tensor, a dict of arrays/tensors, a ``pyarrow.Table``,
    a pandas ``DataFrame``, a ``torch.utils.data.Dataset`` or ``DataLoader``.

    Returns a :class:`ScanReport`: ``report.found`` is true when anything was found (``fp16``:
    whether values beyond float16 count; they are counted and said either way, for data that
    trains in float16), ``report.columns`` holds counts per column or tensor,
    ``report.bad_rows`` the first ``max_rows`` bad rows or samples; ``print(report)`` explains it.
    ``progress`` shows a progress bar on stderr (``nanguard scan`` does on a terminal).
    ``max_samples`` stops a dataset scan early.
    """
    if chunk_bytes < 1024:
        raise ValueError(f"chunk_bytes must be at least 1024, got {chunk_bytes}")
    t0 = time.perf_counter()
    if isinstance(obj, (str, os.PathLike)):
        path = os.fspath(obj)
        report = ScanReport(source=path, format="", chunk_bytes=chunk_bytes, fp16=fp16)
        col = Collector(report, max_rows=max_rows, fp16=fp16)
        _scan_path(path, format, report, col, chunk_bytes, progress)
    else:
        report = ScanReport(source=_describe(obj), format=type(obj).__name__,
                            chunk_bytes=chunk_bytes, fp16=fp16)
        col = Collector(report, max_rows=max_rows, fp16=fp16)
        _scan_object(obj, report, col, chunk_bytes, progress, max_samples)
    col.finish()
    report.seconds = time.perf_counter() - t0
    return report


def _describe(obj: Any) -> str:
    return f"<{type(obj).__name__}>"


#: format -> (module, reader function, the format as messages name it)
_READERS = {
    "csv": ("_csv", "scan_csv", "CSV"),
    "parquet": ("_tabular", "scan_parquet", "Parquet"),
    "npy": ("_arrays", "scan_npy", "NPY"),
    "npz": ("_arrays", "scan_npz", "NPZ"),
    "pt": ("_torch", "scan_pt", "PyTorch (.pt)"),
    "safetensors": ("_torch", "scan_safetensors", "safetensors"),
}


def _scan_path(path: str, fmt: str | None, report: ScanReport, col: Collector, chunk_bytes: int,
               progress: bool) -> None:
    if os.path.isdir(path):
        raise IsADirectoryError(f"a directory, not a file: {path} (nanguard scan DIR scans every "
                                "data file in it)")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such file: {path}")
    fmt = fmt or file_format(path)
    if fmt not in _READERS:
        known = ", ".join(sorted(set(SUFFIXES)))
        raise ValueError(f"unknown data format (known suffixes: {known}); name it with "
                         "format='csv' (nanguard scan --format csv)")
    module, func, name = _READERS[fmt]
    if os.path.getsize(path) == 0:
        raise ScanError(f"empty file (0 bytes): nothing to read as {name}")
    import importlib

    reader = getattr(importlib.import_module(f"{__name__}.{module}"), func)
    try:
        reader(path, report, col, chunk_bytes, progress)
    except (ScanError, ImportError, MemoryError, FileNotFoundError, PermissionError):
        raise
    except Exception as exc:  # what a corrupt file makes the format's own library raise
        raise ScanError(f"not a readable {name} file: {_reason(exc)}") from exc


def _reason(exc: BaseException) -> str:
    """A reader library's exception as a short reason (``EOFError()`` has no message)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, EOFError):
        return "it ends too early (a truncated file?)" + (f": {text}" if text else "")
    if isinstance(exc, zipfile.BadZipFile):
        return f"not a zip archive ({text})" if text else "not a zip archive"
    return text or type(exc).__name__


def _scan_object(obj: Any, report: ScanReport, col: Collector, chunk_bytes: int, progress: bool,
                 max_samples: int | None) -> None:
    from ._arrays import scan_array, scan_arrays

    mod = type(obj).__module__.split(".")[0]
    if isinstance(obj, np.ndarray):
        report.format = f"array {obj.dtype}[{', '.join(map(str, obj.shape))}]"
        scan_array(obj, "", report, col, chunk_bytes)
        report.unit = "row" if obj.ndim == 2 else "sample"
        return
    if "torch" in sys.modules:  # a torch object (or a subclass defined anywhere)
        import torch
        from torch.utils.data import DataLoader, Dataset, IterableDataset

        if isinstance(obj, torch.Tensor):
            from ._torch import scan_tensor

            report.unit = "sample"
            report.format = "tensor"
            scan_tensor(obj, "tensor", report, col, chunk_bytes)
            return
        if isinstance(obj, (DataLoader, Dataset, IterableDataset)):
            from ._torch import scan_dataset

            scan_dataset(obj, report, col, progress, max_samples)
            return
    if mod == "pandas":
        import pyarrow as pa

        from ._tabular import scan_table

        scan_table(pa.Table.from_pandas(obj, preserve_index=False), report, col, chunk_bytes)
        return
    if mod == "pyarrow":
        from ._tabular import scan_table

        scan_table(obj, report, col, chunk_bytes)
        return
    if isinstance(obj, Mapping):
        torch_mod = sys.modules.get("torch")
        if torch_mod is not None and any(isinstance(v, torch_mod.Tensor) for v in obj.values()):
            from ._torch import scan_tensor

            report.unit = "sample"
            for k, v in obj.items():
                if isinstance(v, torch_mod.Tensor):
                    scan_tensor(v, str(k), report, col, chunk_bytes)
                else:  # a NumPy array (or a list of numbers) beside the tensors
                    scan_array(np.asarray(v), str(k), report, col, chunk_bytes)
            return
        scan_arrays(obj, report, col, chunk_bytes)
        return
    if hasattr(obj, "__getitem__") and hasattr(obj, "__len__") and _torch_available():
        from ._torch import scan_dataset

        scan_dataset(obj, report, col, progress, max_samples)  # a map-style dataset by duck type
        return
    raise TypeError(
        f"nanguard.scan: cannot scan a {type(obj).__name__}; pass a path, an array or tensor, a "
        "dict of them, a pyarrow Table, a pandas DataFrame, a Dataset or a DataLoader"
    )


def _torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True
