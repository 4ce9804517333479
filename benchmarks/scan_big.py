"""How fast `nanguard scan` streams a file larger than 1 GB, and how much memory it takes.

    .venv/bin/python benchmarks/scan_big.py [--dir DIR] [--keep]

Writes a 1.1 GB float32 NPY (4.3M rows × 64) and a 1.1 GB CSV (7M rows × 8) into DIR (default:
a temporary directory), plants a NaN and an Inf in each, and scans each in a fresh process at
the default chunk size, printing seconds, throughput and peak RSS growth (``VmHWM`` after the
scan minus before it, with numpy/pyarrow already imported). Measured on 2 cores shared with
other jobs (load ≈ 5):

    format     size       rows  seconds    MB/s  RSS growth
    NPY      1.10GB  4,300,000     2.33     472       32 MB
    CSV      1.10GB  7,000,001    32.32      34      162 MB
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

import numpy as np


def make_npy(path: str) -> None:
    rows, cols = 4_300_000, 64
    m = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, cols))
    block = np.random.default_rng(0).standard_normal((100_000, cols), dtype=np.float32)
    for a in range(0, rows, 100_000):
        m[a : a + 100_000] = block[: min(100_000, rows - a)]
    m[3_000_123, 5] = np.nan
    m[rows - 1, 63] = np.inf
    m.flush()


def make_csv(path: str) -> None:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    rng = np.random.default_rng(0)
    n = 1_000_000
    table = pa.table({f"c{j}": rng.standard_normal(n) for j in range(8)})
    with pacsv.CSVWriter(path, table.schema) as w:
        for _ in range(7):
            w.write_table(table)
    with open(path, "a") as fh:
        fh.write("nan,1,2,3,4,5,6,inf\n")


def measure(path: str) -> dict[str, float]:
    code = textwrap.dedent(f"""
        import json, time

        def hwm():  # peak RSS of this process in KiB (VmHWM: ru_maxrss survives exec)
            with open("/proc/self/status") as fh:
                return next(int(l.split()[1]) for l in fh if l.startswith("VmHWM"))

        import numpy, pyarrow, nanguard, nanguard.datascan._csv
        base = hwm()
        t = time.perf_counter()
        r = nanguard.scan({path!r})
        dt = time.perf_counter() - t
        peak = hwm()
        print(json.dumps({{"seconds": dt, "base_mb": base / 1024, "peak_mb": peak / 1024,
                          "rows": r.rows, "found": r.found}}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    res: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None)
    ap.add_argument("--keep", action="store_true", help="keep the generated files")
    args = ap.parse_args()
    d = args.dir or tempfile.mkdtemp(prefix="nanguard-scan-")
    files = {"NPY": os.path.join(d, "big.npy"), "CSV": os.path.join(d, "big.csv")}
    make_npy(files["NPY"])
    make_csv(files["CSV"])
    print(f"{'format':<6} {'size':>8} {'rows':>10} {'seconds':>8} {'MB/s':>7} {'RSS growth':>11}")
    for fmt, path in files.items():
        size = os.path.getsize(path)
        r = measure(path)
        mbs = size / 1e6 / r["seconds"]
        print(f"{fmt:<6} {size / 1e9:>6.2f}GB {int(r['rows']):>10,} {r['seconds']:>8.2f} "
              f"{mbs:>7.0f} {r['peak_mb'] - r['base_mb']:>8.0f} MB")
        if not args.keep:
            os.unlink(path)


if __name__ == "__main__":
    main()
