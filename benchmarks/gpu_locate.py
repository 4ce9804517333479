"""The locator's key cases on a GPU: exact op, phase and module, and no finding when healthy.

Run by benchmarks/gpu_check.sh (``python benchmarks/gpu_locate.py --device cuda``); on a CPU it
runs the same cases (``--device cpu``). On CUDA the locator keeps its finiteness flags on the device
and reads them once per window of ops — this checks that the answers are the same there.
Prints one table; exits 1 if a case is wrong.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import OrderedDict
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

import nanguard


def _finding(fn: Callable[[], None]) -> nanguard.Finding | None:
    try:
        fn()
    except nanguard.NonFiniteError as err:
        return err.finding
    return None


def cases(dev: torch.device) -> list[tuple[str, Callable[[], None], tuple[str, str, str | None] | None]]:
    def log_softmax() -> None:
        model = nn.Sequential(OrderedDict(proj=nn.Linear(8, 5))).to(dev)
        x = torch.randn(16, 8, device=dev)
        with nanguard.locate(model):
            (-(torch.log(F.softmax(model(x) * 1000, -1))[:, 0]).sum()).backward()

    def sqrt_backward() -> None:
        class Norm(nn.Module):
            def forward(self, v: torch.Tensor) -> torch.Tensor:
                return torch.sqrt((v**2).sum(-1))

        model = nn.Sequential(OrderedDict(proj=nn.Linear(3, 3), norm=Norm())).to(dev)
        with torch.no_grad():
            model.proj.weight.zero_()
            model.proj.bias.zero_()
        with nanguard.locate(model):
            model(torch.randn(4, 3, device=dev)).sum().backward()

    def fp16_matmul() -> None:
        model = nn.Sequential(OrderedDict(fc=nn.Linear(64, 64))).to(dev).half()
        with torch.no_grad():
            model.fc.weight.fill_(40.0)
        with nanguard.locate(model):
            model((torch.rand(4, 64, device=dev) * 60).half()).float().sum().backward()

    def nan_batch() -> None:
        model = nn.Sequential(OrderedDict(fc=nn.Linear(4, 1))).to(dev)
        x = torch.randn(10, 4, device=dev)
        x[7, 2] = float("nan")
        with nanguard.locate(model):
            model(x).mean().backward()

    def healthy_masks() -> None:
        enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 2).to(dev)
        opt = torch.optim.Adam(enc.parameters())
        mask = nn.Transformer.generate_square_subsequent_mask(12, device=dev)
        with nanguard.locate(enc):
            for _ in range(3):
                opt.zero_grad()
                enc(torch.randn(4, 12, 32, device=dev), mask=mask, is_causal=True).sum().backward()
                opt.step()

    return [
        ("log(softmax) underflow", log_softmax, ("aten.log.default", "forward", None)),
        ("sqrt(0) in backward", sqrt_backward, ("aten.div.Tensor", "backward", "norm")),
        ("float16 matmul overflow", fp16_matmul, ("aten.addmm.default", "forward", "fc")),
        ("NaN in the batch", nan_batch, ("input", "data", None)),
        ("healthy transformer, causal mask", healthy_masks, None),
    ]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    dev = torch.device(args.device)
    print(f"# python benchmarks/gpu_locate.py --device {dev}")
    print("| case | expected | got | ok | s |")
    print("|---|---|---|---|---|")
    wrong = 0
    for name, fn, want in cases(dev):
        t0 = time.perf_counter()
        f = _finding(fn)
        dt = time.perf_counter() - t0
        got = None if f is None else (f.op, f.phase, f.module)
        ok = got == want
        wrong += not ok
        print(f"| {name} | {want or 'no finding'} | {got or 'no finding'} | {'✓' if ok else '✗'} | {dt:.2f} |")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
