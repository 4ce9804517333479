"""``nanguard demo``: the seed scenario, caught at its origin, in a few seconds."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from ._console import make_console, print_finding


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="run the seed scenario: a ReLU network with a learning rate far too high",
        description="Train a small ReLU network with a learning rate far too high (the setup "
        "behind TensorFlow's old 'ReluGrad input is not finite') and show where nanguard "
        "finds the first non-finite value, why, and what to change.",
    )
    p.add_argument("--lr", type=float, default=None, help="learning rate (default: the demo's 4.0)")
    p.add_argument("--steps", type=int, default=200, help="training steps (default 200)")
    p.set_defaults(command="demo")


def main(args: argparse.Namespace) -> int:
    from ..core.errors import NonFiniteError
    from ..demos import seed_torch as demo

    console = make_console()
    src = os.path.relpath(demo.__file__) if not os.path.relpath(demo.__file__).startswith("..") else demo.__file__
    lr = args.lr if args.lr is not None else demo.LR
    console.print(
        f"[bold]nanguard demo[/bold] — a 3-layer ReLU network, SGD with lr={lr:g} "
        f"(the seed: 'ReluGrad input is not finite')\n"
        f"source: {src}\n"
    )
    t0 = time.perf_counter()
    try:
        _guard, losses = demo.train(lr, steps=args.steps)
    except NonFiniteError as err:
        dt = time.perf_counter() - t0
        print_finding(console, err.finding, err.diagnosis)
        f = err.finding
        console.print(
            f"\ncaught at step {f.step} after {dt:.2f} s, before the bad update reached the "
            f"weights: made by `{f.op}` in `{f.module}`"
            + (f"; {f.details['relu_grad'].split(' would')[0]} would have named a ReLU instead"
               if f.details.get("relu_grad") else "")
            + "."
        )
        return 0
    console.print(
        f"trained {len(losses)} steps without a non-finite value "
        f"(final loss {losses[-1]:.4g}); try a larger --lr"
    )
    return 0
