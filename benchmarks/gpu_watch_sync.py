"""The deferred watch on a GPU: no host synchronisation on a healthy step, the failure found one
step later at its op, and what the watch costs against plain training and the floor.

Run by benchmarks/gpu_check.sh (``python benchmarks/gpu_watch_sync.py --device cuda``). On the CPU
(``--device cpu``) the same checks run with ``NANGUARD_WATCH_DEFERRED=1`` and the sync check is
skipped (``torch.cuda.set_sync_debug_mode`` exists only with CUDA). Exits 1 if a check fails.

1. healthy steps under ``torch.cuda.set_sync_debug_mode("error")``: any synchronising call in a
   step (``.item()``, ``.tolist()``, a blocking copy to the host) raises;
2. a ``log(0)`` in batch 5: ``NonFiniteError`` at step 6's ``optimizer.step()`` naming
   ``aten.log.default`` in module ``log`` at step 5, and the weights those of before step 5;
3. median step time of plain / floor (one ``_foreach_norm`` + one host read) / watch, for a
   fused and a plain (foreach) AdamW.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

import nanguard


class Log1p(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x + 1.0)  # log(0) where a feature is -1


def model_on(dev: torch.device, width: int) -> nn.Module:
    return nn.Sequential(OrderedDict(
        log=Log1p(), fc1=nn.Linear(256, width), act=nn.GELU(), fc2=nn.Linear(width, width),
        act2=nn.GELU(), fc3=nn.Linear(width, 10))).to(dev)


def batch(dev: torch.device, bad: bool = False, b: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.rand(b, 256, device=dev)
    if bad:
        x[3, 7] = -1.0
    return x, torch.randint(0, 10, (b,), device=dev)


def step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
         floor: bool = False) -> None:
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    if floor:
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        torch.stack([*torch._foreach_norm(grads), loss.detach()]).tolist()
    opt.step()


def check_no_sync(dev: torch.device) -> bool:
    model = model_on(dev, 1024)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    batches = [batch(dev) for _ in range(20)]
    with nanguard.attach(model, opt) as guard:
        for i, (x, y) in enumerate(batches):
            if i >= 2 and dev.type == "cuda":
                torch.cuda.set_sync_debug_mode("error")
            try:
                step(model, opt, x, y)
            finally:
                if dev.type == "cuda":
                    torch.cuda.set_sync_debug_mode("default")
        ok = guard.opt_hooks.defer is True and not guard.findings
    print(f"| healthy steps 2-19 under set_sync_debug_mode('error') | {'ok' if ok else 'FAILED'} |")
    return ok


def check_one_step_later(dev: torch.device) -> bool:
    torch.manual_seed(0)
    model = model_on(dev, 256)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before: list[torch.Tensor] = []
    finding = None
    try:
        with nanguard.attach(model, opt):
            for i in range(10):
                if i == 5:
                    before = [p.detach().clone() for p in model.parameters()]
                step(model, opt, *batch(dev, bad=i == 5))
    except nanguard.NonFiniteError as err:
        finding = err.finding
    got = (finding.op, finding.module, finding.step) if finding is not None else None
    same = bool(before) and all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    ok = got == ("aten.log.default", "log", 5) and same
    print(f"| log(0) at step 5: found at step 6 as {got}, weights of before step 5: {same} | "
          f"{'ok' if ok else 'FAILED'} |")
    return ok


def timing(dev: torch.device, fused: bool, steps: int, repeats: int) -> None:
    torch.manual_seed(0)
    model = model_on(dev, 2048)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)
    batches = [batch(dev) for _ in range(steps)]
    times: dict[str, list[float]] = {"plain": [], "floor": [], "watch": []}

    def block(v: str) -> None:
        guard = nanguard.attach(model, opt) if v == "watch" else None
        try:
            for x, y in batches:
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                step(model, opt, x, y, floor=v == "floor")
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                times[v].append(time.perf_counter() - t0)
        finally:
            if guard is not None:
                guard.detach()

    for v in times:
        block(v)  # warm-up
        times[v].clear()
    for r in range(repeats):
        order = list(times)[r % 3:] + list(times)[: r % 3]
        for v in order:
            block(v)
    med = {v: statistics.median(ts) for v, ts in times.items()}
    print(f"| MLP 256-2048-2048-10 b256, AdamW fused={fused} | {med['plain'] * 1e3:.3f} | "
          f"{med['floor'] / med['plain']:.3f}x | {med['watch'] / med['plain']:.3f}x |", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--repeats", type=int, default=6)
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    if dev.type != "cuda":
        os.environ["NANGUARD_WATCH_DEFERRED"] = "1"
    print(f"# python benchmarks/gpu_watch_sync.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    print("| check | result |")
    print("|---|---|")
    ok = check_no_sync(dev) & check_one_step_later(dev)
    print()
    print("| model | plain ms/step | floor | watch (deferred) |")
    print("|---|---|---|---|")
    for fused in (True, False):
        timing(dev, fused, args.steps, args.repeats)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
