"""How fast the gradient grows going back through a hand-stepped recurrent cell, as nanguard's
recurrence probe measures it, for the cells and initialisations in common use.

    python benchmarks/recurrence_gain.py              # 40 calls per sequence
    python benchmarks/recurrence_gain.py --length 100

Each row is one forward and backward of a cell stepped by hand over a random sequence (batch 16,
hidden 64), under the hazard look's mode (``nanguard check``'s, and the watch's on its sampled
steps), with the loss on the last output only or on every output. The table gives the fitted
growth per call going back, the chain of calls at which float32 would overflow at that rate, and
whether the hazard look ranks it risky (≤ ``RECURRENCE_EDGE`` calls). A benchmark: it prints,
it never gates; the exit status is always 0.
"""

from __future__ import annotations

import argparse
import math

import torch
from torch import nn

from nanguard.core.hazards import RECURRENCE_EDGE, HazardBook
from nanguard.torch._modules import ModuleStack
from nanguard.torch.hazards import HazardMode

CELLS = {"RNNCell (tanh)": nn.RNNCell, "GRUCell": nn.GRUCell, "LSTMCell": nn.LSTMCell}
#: the recurrent weight's init: PyTorch's default, orthogonal, or normal with std gain/sqrt(hidden)
INITS = ("default", "orthogonal", "normal gain 1", "normal gain 1.5", "normal gain 2", "normal gain 3")


def _cell(kind: str, init: str, hidden: int) -> nn.Module:
    cell = CELLS[kind](8, hidden)
    if init == "orthogonal":
        nn.init.orthogonal_(cell.weight_hh)
    elif init.startswith("normal"):
        nn.init.normal_(cell.weight_hh, 0.0, float(init.split()[-1]) / math.sqrt(hidden))
    return cell


def measure(kind: str, init: str, length: int, every: bool, hidden: int = 64) -> tuple[float, float]:
    """(growth per call, calls to overflow) of one step; ``(nan, nan)`` when nothing was fitted."""
    torch.manual_seed(0)
    cell, head = _cell(kind, init, hidden), nn.Linear(hidden, 1)
    x = torch.randn(16, length, 8)
    mode = HazardMode(HazardBook(), ModuleStack(cell))
    with mode:
        h = torch.zeros(16, hidden)
        c = torch.zeros(16, hidden)
        outs = []
        for t in range(length):
            if kind == "LSTMCell":
                h, c = cell(x[:, t], (h, c))
            else:
                h = cell(x[:, t], h)
            outs.append(head(h))
        y = torch.cat(outs, 1) if every else outs[-1]
        y.pow(2).mean().backward()
    gains = mode.step_done()
    return (gains[0].rate, gains[0].overflow_at) if gains else (math.nan, math.nan)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--length", type=int, default=40, help="calls per sequence (default 40)")
    a = p.parse_args()
    torch.set_num_threads(1)
    print(f"# python benchmarks/recurrence_gain.py --length {a.length}\n")
    print("| cell | recurrent init | loss on | growth per call | float32 overflows at (calls) | risky |")
    print("|---|---|---|---|---|---|")
    for kind in CELLS:
        for init in INITS:
            for every in (False, True):
                rate, at = measure(kind, init, a.length, every)
                shown = "never" if not math.isfinite(at) else f"~{at:.0f}"
                risky = "yes" if at <= RECURRENCE_EDGE else "no"
                print(f"| {kind} | {init} | {'every output' if every else 'last output'} | ×{rate:.3f} "
                      f"| {shown} | {risky} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
