"""``nanguard scan PATH...``: NaN/Inf, missing cells and float16 overflow in data files."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

__all__ = ["EXIT_FOUND", "add_parser", "main"]

#: exit status when something was found (as ``nanguard run`` on a non-finite value)
EXIT_FOUND = 3


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "scan",
        help="find NaN/Inf, missing cells and float16 overflow in data files",
        description="Scan CSV/TSV, Parquet, NPY/NPZ, .pt/.pth and safetensors files (or every "
        "such file in a directory) for NaN/Inf, empty or missing cells (they become NaN in a "
        "float tensor), non-numeric cells in numeric columns and values beyond float16 "
        "(|x| > 65504: information, a problem with --fp16). Files are streamed in chunks: "
        "memory stays bounded. A file that cannot be read is one line on stderr; the others are "
        "still scanned. Exit status: 0 clean, 3 found (NaN/Inf, missing or non-numeric cells; "
        "values beyond float16 with --fp16), 2 unreadable, not all checked or unknown format "
        "(3 outranks 2).",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="files or directories to scan")
    p.add_argument("--json", action="store_true", help="print one JSON document (a list of reports)")
    p.add_argument("--max-rows", type=_max_rows, default=10, metavar="N",
                   help="list the first N bad rows/samples of each file (default 10)")
    p.add_argument("--fp16", action="store_true",
                   help="the data trains in float16 (fp16 autocast, .half()): values beyond "
                   "float16 count as found (exit 3); without it they are said as information")
    p.add_argument("--no-fp16", action="store_true", help=argparse.SUPPRESS)  # the old default
    p.add_argument("--chunk-mb", type=_chunk_mb, default=16, metavar="MB",
                   help="megabytes read per chunk: bounds memory (default 16)")
    p.add_argument("--format", choices=("csv", "parquet", "npy", "npz", "pt", "safetensors"),
                   help="read every PATH as this format (default: from the suffix)")
    p.set_defaults(command="scan")


def _max_rows(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(
            f"{text!r}: the number of bad rows to list must be a whole number, 0 or more")
    return n


#: the chunk size --chunk-mb accepts: from about 1 KiB to 64 GiB
_CHUNK_MB = (0.001, 65536.0)


def _chunk_mb(text: str) -> float:
    try:
        mb = float(text)
    except ValueError:
        mb = math.nan
    lo, hi = _CHUNK_MB
    if not (lo <= mb <= hi):  # also NaN and inf
        raise argparse.ArgumentTypeError(
            f"{text!r}: the megabytes read per chunk must be a number from {lo:g} (1 KiB) to "
            f"{hi:g}; the default, 16, suits most machines")
    return mb


def _expand(paths: list[str], fmt: str | None) -> list[str]:
    from ..datascan import file_format

    out: list[str] = []
    for p in paths:
        if os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                dirs.sort()
                out += [os.path.join(root, f) for f in sorted(files)
                        if fmt is not None or file_format(f) is not None]
        else:
            out.append(p)
    return out


def _scan_one(path: str, args: argparse.Namespace, progress: bool) -> Any:
    """The report of ``path``, or a one-line error (``str``) when it cannot be read."""
    from ..datascan import scan

    try:
        return scan(path, max_rows=args.max_rows, fp16=args.fp16 and not args.no_fp16,
                    chunk_bytes=max(1024, int(args.chunk_mb * (1 << 20))), progress=progress,
                    format=args.format)
    except (OSError, ValueError, ImportError, RuntimeError) as exc:
        return str(exc) or type(exc).__name__
    except Exception as exc:  # a reader's bug must not stop the other files either
        return f"{type(exc).__name__}: {exc} (an error in nanguard scan: please report it)"


def main(args: argparse.Namespace) -> int:
    from ._console import make_console

    console = make_console()
    err = make_console(sys.stderr)
    status = 0
    docs: list[dict[str, Any]] = []
    files = _expand(args.paths, args.format)
    if not files:
        print("nanguard scan: no data files found", file=sys.stderr)
        return 2
    shown = 0
    for path in files:
        report = _scan_one(path, args, progress=err.is_terminal and not args.json)
        if isinstance(report, str):
            print(f"nanguard scan: {path}: {report}", file=sys.stderr)
            status = max(status, 2)  # found (3) outranks unreadable (2)
            docs.append({"source": path, "error": report, "found": None, "complete": False})
            continue
        if report.found:
            status = EXIT_FOUND
        elif not report.complete:
            status = max(status, 2)  # some arrays could not be checked
        if args.json:
            docs.append(report.to_dict())
            continue
        if shown:
            console.file.write("\n")
        shown += 1
        if console.is_terminal:
            console.print(report)
        else:
            console.file.write(str(report) + "\n")
    if args.json:
        print(json.dumps(docs, indent=1, allow_nan=False))
    return status
