"""``nanguard scan PATH...``: NaN/Inf, missing cells and float16 overflow in data files."""

from __future__ import annotations

import argparse
import json
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
        "(|x| > 65504). Files are streamed in chunks: memory stays bounded. "
        "Exit status: 0 clean, 3 found, 2 unreadable or unknown format.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="files or directories to scan")
    p.add_argument("--json", action="store_true", help="print one JSON document (a list of reports)")
    p.add_argument("--max-rows", type=int, default=10, metavar="N",
                   help="list the first N bad rows/samples of each file (default 10)")
    p.add_argument("--no-fp16", action="store_true",
                   help="do not count values beyond float16 as problems (still reported)")
    p.add_argument("--chunk-mb", type=float, default=16, metavar="MB",
                   help="megabytes read per chunk: bounds memory (default 16)")
    p.add_argument("--format", choices=("csv", "parquet", "npy", "npz", "pt", "safetensors"),
                   help="read every PATH as this format (default: from the suffix)")
    p.set_defaults(command="scan")


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


def main(args: argparse.Namespace) -> int:
    from ..datascan import ScanReport, scan
    from ._console import make_console

    console = make_console()
    err = make_console(sys.stderr)
    status = 0
    docs: list[dict[str, Any]] = []
    files = _expand(args.paths, args.format)
    if not files:
        print("nanguard scan: no data files found", file=sys.stderr)
        return 2
    for i, path in enumerate(files):
        try:
            report: ScanReport = scan(
                path, max_rows=args.max_rows, fp16=not args.no_fp16,
                chunk_bytes=max(1024, int(args.chunk_mb * (1 << 20))),
                progress=err.is_terminal and not args.json, format=args.format,
            )
        except (OSError, ValueError, ImportError, RuntimeError) as exc:
            print(f"nanguard scan: {path}: {exc}", file=sys.stderr)
            status = max(status, 2)  # found (3) outranks unreadable (2)
            docs.append({"source": path, "error": str(exc)})
            continue
        if report.found:
            status = EXIT_FOUND
        if args.json:
            docs.append(report.to_dict())
            continue
        if i:
            console.file.write("\n")
        if console.is_terminal:
            console.print(report)
        else:
            console.file.write(str(report) + "\n")
    if args.json:
        print(json.dumps(docs, indent=1, allow_nan=False))
    return status
