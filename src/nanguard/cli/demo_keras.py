"""``nanguard demo --framework keras``: the seed scenario in Keras — caught at its origin,
explained, compared with where TensorFlow's old ``ReluGrad input is not finite`` fired, then
recovered."""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

from ._console import make_console, print_finding


def _rel(path: str) -> str:
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def main(args: argparse.Namespace) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up chatter
    console = make_console()
    try:
        from ..demos import seed_keras as demo
    except ImportError as exc:  # printed as is: rich would take "[tf]" for markup and drop it
        print(f"nanguard demo --framework keras needs Keras 3 on TensorFlow ({exc}); install "
              "it with: pip install 'nanguard[tf]'", file=sys.stderr)
        return 2
    from ..core.errors import NonFiniteError

    lr = args.lr if args.lr is not None else demo.LR
    steps = args.steps
    console.print(
        f"[bold]nanguard demo --framework keras[/bold] — a Dense/ReLU network, SGD with "
        f"lr={lr:g} (the seed: 'ReluGrad input is not finite')\nsource: {_rel(demo.__file__)}\n"
    )
    console.print("[bold]1. policy='raise'[/bold]: stop at the first non-finite value\n")
    t0 = time.perf_counter()
    try:
        _cb, losses = demo.train(lr, steps=steps)
    except NonFiniteError as err:
        dt = time.perf_counter() - t0
        print_finding(console, err.finding, err.diagnosis)
        f = err.finding
        relu = f.details.get("relu_grad")
        console.print(
            f"\ncaught at step {f.step} after {dt:.2f} s, before the bad update reached the weights."
        )
        if relu:
            old = f.details.get("relu_grad_layer") or "a ReLU"
            console.print(f"  TensorFlow 1.x stopped at:  {old}, backward pass: 'ReluGrad input is not finite'")
        where = f"`{f.module}` ({f.module_type})" if f.module else "outside any layer"
        console.print(f"  the value was made by:      `{f.op}` in {where}, {f.phase} pass, step {f.step}")
        if err.diagnosis is not None:
            console.print(f"  the cause:                  {err.diagnosis.cause.value}")
        console.print(
            "  TensorFlow 2 says nothing:  ReluGrad maps NaN to 0; check_numerics names no layer, no cause\n"
        )
    else:
        console.print(
            f"trained {len(losses)} steps without a non-finite value "
            f"(final loss {losses[-1]:.4g}); try a larger --lr"
        )
        return 0

    console.print("[bold]2. policy='recover'[/bold]: the same run, kept alive\n")
    cb, losses = demo.train(lr, steps=steps, policy="recover")
    for r in cb.recoveries:
        new_lr = lr * r.get("lr_scale", 1.0)
        restored = r.get("restored_step")
        back = (
            f"rolled back to the snapshot of step {restored} ({r.get('steps_lost', 0)} steps lost)"
            if restored is not None
            else "skipped the update"
        )
        console.print(f"  step {r['step']}: {r['reason']} → {back},")
        console.print(f"    {r['description']}: lr {lr:g} → {new_lr:.3g}")
    finite = [v for v in losses if math.isfinite(v)]
    marks = [0, 10, 25, 50, 100, len(losses) - 1]
    curve = "  ".join(f"{i}:{losses[i]:.3g}" for i in marks if i < len(losses))
    console.print(f"\n  loss by step  {curve}")
    tail = losses[-min(50, len(losses)):]
    ok = bool(finite) and all(math.isfinite(v) for v in tail) and finite[-1] < finite[0]
    console.print(
        f"\n  {len(losses)} steps, {len(cb.findings)} non-finite event(s), "
        f"{len(cb.recoveries)} recovery(ies); final loss {losses[-1]:.4g} "
        + ("(finite and decreasing)." if ok else "(did not converge).")
    )
    return 0
