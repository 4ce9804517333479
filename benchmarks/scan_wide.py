"""How `nanguard scan` time grows with the number of columns of a CSV (it should be linear).

    .venv/bin/python benchmarks/scan_wide.py [--rows 2] [--max-columns 200000] [--dir DIR]

Writes CSVs of ``--rows`` data rows (default 2, the shape of a wide feature export) and 1,000 to
200,000 columns of random numbers, with a NaN planted in the last column, and times
``nanguard.scan`` on each (in this process, after one warm-up scan; best of ``--repeats``). The
last column is the time per cell: flat when the time is linear in the number of cells.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

COLUMNS = (1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000)


def make_csv(path: str, rows: int, cols: int) -> None:
    rng = np.random.default_rng(0)
    with open(path, "w") as fh:
        fh.write(",".join(f"f{j}" for j in range(cols)) + "\n")
        for r in range(rows):
            vals = [f"{v:.5f}" for v in rng.standard_normal(cols)]
            if r == rows - 1:
                vals[-1] = "nan"
            fh.write(",".join(vals) + "\n")


def time_scan(path: str, repeats: int) -> tuple[float, bool]:
    import nanguard

    best = float("inf")
    found = False
    for _ in range(repeats):
        t0 = time.perf_counter()
        report = nanguard.scan(path)
        best = min(best, time.perf_counter() - t0)
        found = report.found and report.totals()["nan"] == 1
    return best, found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--max-columns", type=int, default=COLUMNS[-1])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    d = args.dir or tempfile.mkdtemp(prefix="nanguard-wide-")
    warm = os.path.join(d, "warm.csv")
    make_csv(warm, 2, 10)
    time_scan(warm, 1)  # imports pyarrow and nanguard's readers
    os.unlink(warm)
    print(f"# python benchmarks/scan_wide.py --rows {args.rows}   (best of {args.repeats})")
    print("| columns | cells | file | seconds | µs per cell | NaN found |")
    print("|---|---|---|---|---|---|")
    for cols in [c for c in COLUMNS if c <= args.max_columns]:
        path = os.path.join(d, f"wide{cols}.csv")
        make_csv(path, args.rows, cols)
        size = os.path.getsize(path)
        seconds, found = time_scan(path, args.repeats)
        cells = cols * args.rows
        print(f"| {cols:,} | {cells:,} | {size / 1e6:.2f} MB | {seconds:.2f} | "
              f"{seconds / cells * 1e6:.2f} | {'yes' if found else 'NO'} |", flush=True)
        os.unlink(path)
    if not args.dir:
        os.rmdir(d)


if __name__ == "__main__":
    main()
