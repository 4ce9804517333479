"""Two ranks, one of them making a NaN: FSDP2 on NCCL where the machine has 2 GPUs (gloo on the
CPU otherwise, which is how it is checked without one). Run under torchrun and nanguard::

    torchrun --nproc_per_node 2 -m nanguard run --policy skip --json /tmp/ranks.json benchmarks/gpu_ranks.py
    python benchmarks/gpu_ranks.py --table /tmp/ranks.json      # one row per rank

Rank 1 alone meets ``log(0)`` at step 3; every rank should report it at ``aten.log.default``,
credited to rank 1, skip the same step and end with one model (the same weight sum on both
ranks), with no hang (torchrun's own timeout is the check's).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return self.body(x) * torch.log(scale)


def train() -> None:
    from torch.distributed.fsdp import fully_shard

    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= 2
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    dev = torch.device(f"cuda:{rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(dev)
    torch.manual_seed(0)
    model = Net().to(dev)
    for m in model.body:
        if isinstance(m, nn.Linear):
            fully_shard(m)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator(device=dev).manual_seed(rank)
    for step in range(20):
        x = torch.randn(128, 64, generator=g, device=dev)
        scale = torch.rand(128, 1, generator=g, device=dev) + 1.5
        if rank == 1 and step == 3:
            scale[7, 0] = 0.0
        opt.zero_grad()
        F.mse_loss(model(x, scale), x.sum(1, keepdim=True)).backward()
        opt.step()
    full = [p.full_tensor() for p in model.parameters()]
    out = {"rank": rank, "backend": dist.get_backend(), "device": str(dev),
           "finite": all(bool(torch.isfinite(p).all()) for p in full),
           "sum": float(sum(p.detach().double().sum() for p in full))}
    with open(f"gpu_ranks.rank{rank}.json", "w") as fh:
        json.dump(out, fh)
    del model, opt, full
    gc.collect()
    dist.destroy_process_group()


def table(path: str) -> None:
    stem, ext = os.path.splitext(path)
    print("| rank | backend | device | events (step, op, credited to) | status | finite | weight sum |")
    print("|---|---|---|---|---|---|---|")
    for r in (0, 1):
        log = json.loads(Path(path if r == 0 else f"{stem}.rank{r}{ext}").read_text())
        w = json.loads(Path(f"gpu_ranks.rank{r}.json").read_text())
        ev = ", ".join(f"({e['step']}, {e['op']}, rank {e['rank']})" for e in log["events"])
        print(f"| {r} | {w['backend']} | {w['device']} | {ev} | {log['status']} | {w['finite']} | {w['sum']:.6f} |")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--table", metavar="RUN_JSON", help="print the ranks' table of a finished run")
    a = p.parse_args()
    if a.table:
        table(a.table)
    else:
        train()
    sys.exit(0)
