"""What the snapshot that policy ``raise`` keeps (to try its advice from) costs a healthy run.

    OMP_NUM_THREADS=1 python benchmarks/snapshot_cost.py            # two MLP widths, 1,500 steps

The same guarded run (Adam, ``raise``) with the snapshot budget on (the default: a copy every 50
steps or less often, at most 0.2 % of the steps' time by the measured copy) and off (``MAX_BYTES``
0: no snapshot), interleaved three times; the table gives the middle of the three mean step times
(the mean, not the median: a copy every ~50 steps would vanish from a median). Timing is never
asserted anywhere: this prints numbers.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

import nanguard
from nanguard.core.snapbudget import SnapshotBudget


def run(steps: int, width: int) -> tuple[float, int]:
    """Mean µs per guarded step, and the snapshots taken."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(256, 64), torch.randint(0, 10, (256,))
    with nanguard.attach(model, opt) as guard:
        t0 = time.perf_counter()
        for _ in range(steps):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        dt = time.perf_counter() - t0
    return dt / steps * 1e6, guard.snapshots.taken


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--widths", default="128,1024")
    args = parser.parse_args()
    torch.set_num_threads(1)
    budget = SnapshotBudget.MAX_BYTES
    print("| MLP width | parameters | µs/step, snapshots kept | µs/step, none | ratio | snapshots taken |")
    print("|---|---|---|---|---|---|")
    for width in (int(w) for w in args.widths.split(",")):
        on: list[tuple[float, int]] = []
        off: list[tuple[float, int]] = []
        for _ in range(3):
            for keep, out in ((True, on), (False, off)):
                SnapshotBudget.MAX_BYTES = budget if keep else 0
                out.append(run(args.steps, width))
        SnapshotBudget.MAX_BYTES = budget
        a, b = sorted(v for v, _ in on)[1], sorted(v for v, _ in off)[1]
        n = 64 * width + width + width * width + width + width * 10 + 10
        print(f"| {width} | {n:,} | {a:.0f} | {b:.0f} | {a / b:.3f} | {on[0][1]} in {args.steps} steps |")


if __name__ == "__main__":
    main()
