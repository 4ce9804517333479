"""``nanguard demo``: the seed scenario — caught at its origin, explained, then recovered."""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Any

from ._console import make_console, print_finding


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="run the seed scenario: a ReLU network with a learning rate far too high",
        description="Train a small ReLU network with a learning rate far too high (the setup "
        "behind TensorFlow's old 'ReluGrad input is not finite'): show where nanguard finds the "
        "first non-finite value, why, and what to change; then run it again under the 'recover' "
        "policy and let it finish.",
    )
    p.add_argument("--lr", type=float, default=None, help="learning rate (default: the demo's 4.0)")
    p.add_argument("--steps", type=int, default=200, help="training steps (default 200)")
    p.add_argument(
        "--framework",
        choices=("torch", "keras"),
        default="torch",
        help="run the PyTorch demo (default) or the Keras 3 / TensorFlow one",
    )
    p.set_defaults(command="demo")


def _rel(path: str) -> str:
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def main(args: argparse.Namespace) -> int:
    if args.framework == "keras":
        from .demo_keras import main as keras_main

        return keras_main(args)
    from ..core.errors import NonFiniteError

    try:
        from ..demos import seed_torch as demo
    except ImportError as exc:  # the base install: numpy and rich only
        print(f"nanguard demo needs PyTorch ({exc}); install it with: pip install "
              "'nanguard[torch]' (or: pip install torch), or run nanguard demo --framework keras",
              file=sys.stderr)
        return 2
    console = make_console()
    lr = args.lr if args.lr is not None else demo.LR
    console.print(
        f"[bold]nanguard demo[/bold] — a 3-layer ReLU network, SGD with lr={lr:g} "
        f"(the seed: 'ReluGrad input is not finite')\nsource: {_rel(demo.__file__)}\n"
    )
    console.print("[bold]1. policy='raise'[/bold]: stop at the first non-finite value\n")
    t0 = time.perf_counter()
    try:
        _guard, losses = demo.train(lr, steps=args.steps)
    except NonFiniteError as err:
        dt = time.perf_counter() - t0
        print_finding(console, err.finding, err.diagnosis)
        f = err.finding
        console.print(
            f"\ncaught at step {f.step} after {dt:.2f} s, before the bad update reached the weights."
        )
        if f.details.get("relu_grad_layer"):
            console.print(
                f"  early TensorFlow stopped at: {f.details['relu_grad_layer']}, backward pass: "
                "'ReluGrad input is not finite'"
            )
        where = f"`{f.module}` ({f.module_type})" if f.module else "outside any module"
        console.print(f"  the value was made by:       `{f.op}` in {where}, {f.phase} pass, step {f.step}")
        if err.diagnosis is not None:
            console.print(f"  the cause:                   {err.diagnosis.cause.value}\n")
    else:
        console.print(
            f"trained {len(losses)} steps without a non-finite value "
            f"(final loss {losses[-1]:.4g}); try a larger --lr"
        )
        return 0

    console.print("[bold]2. policy='recover'[/bold]: the same run, kept alive\n")
    guard, losses = demo.train(lr, steps=args.steps, policy="recover")
    for r in guard.recoveries:
        new_lr = lr * r.get("lr_scale", 1.0)
        console.print(
            f"  step {r['step']}: {r['reason']} → rolled back to the snapshot of step "
            f"{r.get('restored_step')} ({r.get('steps_lost', 0)} steps lost),"
        )
        console.print(f"    {r['description']}: lr {lr:g} → {new_lr:.3g}")
    finite = [v for v in losses if math.isfinite(v)]
    marks = [0, 10, 25, 50, 100, len(losses) - 1]
    curve = "  ".join(f"{i}:{losses[i]:.3g}" for i in marks if i < len(losses))
    console.print(f"\n  loss by step  {curve}")
    ok = all(math.isfinite(v) for v in losses[-50:]) and finite[-1] < finite[0]
    console.print(
        f"\n  {len(losses)} steps, {len(guard.findings)} non-finite event(s), "
        f"{len(guard.recoveries)} recovery(ies); final loss {losses[-1]:.4g} "
        + ("(finite and decreasing)." if ok else "(did not converge).")
    )
    return 0
