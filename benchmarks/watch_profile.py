"""Where watch's fixed cost per step goes, on one small model (the profile behind the README).

Usage::

    python benchmarks/watch_profile.py              # the small MLP of overhead.py
    python benchmarks/watch_profile.py --model LSTM --size S

Three tables. First the median time of each part of a training step (``zero_grad``, the model's
forward, the loss, ``backward()``, ``step()``) without and with ``nanguard.attach``. Then an
ablation: the guard with one more of its parts switched off at a time (by replacing the method
with a no-op, in this process only), so each row's drop is what that part costs; between them,
the guard's own methods timed call by call (median µs, calls per step). Nothing here is
asserted; the numbers move by ±20 µs between runs on a shared machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import functools

import overhead
from nanguard.torch import _backward_hooks, _optimizer_hooks, _recorder, _update_replay
from nanguard.torch import guard as _guard

PARTS = ("zero_grad", "forward", "loss", "backward", "step")


def phases(case: overhead.Case, variant: str, model: torch.nn.Module, opt: torch.optim.Optimizer,
           steps: int) -> dict[str, float]:
    dev = torch.device("cpu")
    batches = [case.batch(dev) for _ in range(steps)]
    times: dict[str, list[float]] = {k: [] for k in PARTS}
    with overhead.variant_ctx(variant, model, opt):
        for x, y in batches:
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            t1 = time.perf_counter()
            out = model(x)
            t2 = time.perf_counter()
            loss = case.loss(out, y)
            t3 = time.perf_counter()
            loss.backward()
            t4 = time.perf_counter()
            opt.step()
            t5 = time.perf_counter()
            for k, a, b in zip(PARTS, (t0, t1, t2, t3, t4), (t1, t2, t3, t4, t5)):
                times[k].append(b - a)
    return {k: statistics.median(v) for k, v in times.items()}


def _noop(*_a: object, **_k: object) -> None:
    return None


#: (the part, its owner, the attribute): timed call by call in the third table
TIMED: list[tuple[str, object, str]] = [
    ("pre-step hook, all of it", _optimizer_hooks.OptimizerHooks, "pre"),
    ("  the fused check (gradients + weights, one read)", _optimizer_hooks, "check"),
    ("  the update-replay copy", _update_replay.UpdateReplay, "keep"),
    ("post-step hook, all of it", _optimizer_hooks.OptimizerHooks, "post"),
    ("  the step's reading (history record)", _guard.Guard, "_reading"),
    ("  the end of the step", _guard.Guard, "end_step"),
    ("backward(): before the engine", _backward_hooks.BackwardHooks, "before"),
    ("backward(): after the engine", _backward_hooks.BackwardHooks, "after"),
    ("model call recorded: enter", _recorder.StepRecorder, "root_enter"),
    ("model call recorded: exit", _recorder.StepRecorder, "root_exit"),
    ("an op outside modules on the tape", _recorder.StepRecorder, "_tape_op"),
    ("the tape's mode pushed", _recorder.StepRecorder, "tape_on"),
    ("the tape's mode popped", _recorder.StepRecorder, "tape_off"),
]


def hook_table(case: overhead.Case, model: torch.nn.Module, opt: torch.optim.Optimizer,
               steps: int) -> list[tuple[str, float, float]]:
    """(part, calls per step, median µs per call) of the guard's own methods on watch steps."""
    acc: dict[str, list[float]] = {name: [] for name, _, _ in TIMED}
    saved = []
    for name, owner, attr in TIMED:
        fn = getattr(owner, attr)
        saved.append((owner, attr, fn))

        def timed(*a: object, _fn: Callable[..., object] = fn, _k: str = name, **k: object) -> object:
            t0 = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                acc[_k].append(time.perf_counter() - t0)

        setattr(owner, attr, functools.wraps(fn)(timed))
    try:
        overhead.step_times(case, "watch", model, opt, torch.device("cpu"), steps)
    finally:
        for owner, attr, fn in saved:
            setattr(owner, attr, fn)
    return [(n, len(v) / steps, statistics.median(v) * 1e6 if v else 0.0) for n, v in acc.items()]


#: (what is switched off, the class, the method) — cumulative, in this order
ABLATION: list[tuple[str, type, str]] = [
    ("the copy kept to replay an update", _update_replay.UpdateReplay, "keep"),
    ("the tape of ops outside modules", _recorder.StepRecorder, "tape_on"),
    ("recording the model call", _recorder.StepRecorder, "root_enter"),
    ("the per-step reading for the history", _guard.Guard, "_reading"),
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="MLP", help="MLP, CNN+BN, Transformer or LSTM")
    p.add_argument("--size", default="S", choices=["S", "L"])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    case = next(c for c in overhead.cases(False) if c.name == args.model and c.size == args.size)
    torch.manual_seed(0)
    model = case.build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    print(f"# python benchmarks/watch_profile.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    print(f"# torch {torch.__version__}, {case.name} {case.size}, threads {torch.get_num_threads()}, "
          f"{args.repeats} round-robin repeats x {args.steps} steps, median µs")

    def both() -> tuple[dict[str, float], dict[str, float]]:
        runs: dict[str, list[dict[str, float]]] = {"plain": [], "watch": []}
        for _ in range(args.repeats):
            for v in runs:
                runs[v].append(phases(case, v, model, opt, args.steps))
        med = {v: {k: statistics.median(r[k] for r in rs) for k in PARTS} for v, rs in runs.items()}
        return med["plain"], med["watch"]

    plain, watch = both()
    print()
    print("| part of the step | plain µs | watch µs | added µs |")
    print("|---|---|---|---|")
    for k in PARTS:
        print(f"| {k} | {plain[k] * 1e6:.0f} | {watch[k] * 1e6:.0f} | {(watch[k] - plain[k]) * 1e6:+.0f} |")
    tp, tw = sum(plain.values()), sum(watch.values())
    print(f"| **all** | {tp * 1e6:.0f} | {tw * 1e6:.0f} | {(tw - tp) * 1e6:+.0f} |")

    print()
    print("| the guard's part (timed call by call) | calls per step | median µs per call |")
    print("|---|---|---|")
    for name, n, us in hook_table(case, model, opt, args.steps):
        print(f"| {name} | {n:.1f} | {us:.1f} |")

    print()
    print("| switched off (cumulative) | watch adds µs per step |")
    print("|---|---|")
    print(f"| nothing | {(tw - tp) * 1e6:.0f} |")
    saved: list[tuple[type, str, Callable[..., object]]] = []
    try:
        for what, cls, name in ABLATION:
            saved.append((cls, name, getattr(cls, name)))
            setattr(cls, name, _noop)
            plain, watch = both()
            print(f"| + {what} | {(sum(watch.values()) - sum(plain.values())) * 1e6:.0f} |", flush=True)
    finally:
        for cls, name, fn in reversed(saved):
            setattr(cls, name, fn)
    return 0


if __name__ == "__main__":
    sys.exit(main())
