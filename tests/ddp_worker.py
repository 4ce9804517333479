"""Two-process DDP run (gloo) used by test_distributed.py: ``python ddp_worker.py OUT POLICY``.

Rank 1 meets a NaN batch at step 2; every rank must skip (or roll back) that same step, none may
hang, and each rank's log must name rank 1.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import nanguard


def worker(rank: int, world: int, out: str, policy: str, port: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.randn(6, 8, 8) + rank
    if rank == 1:
        data[2, 3, 4] = float("nan")
    result: dict[str, object] = {"rank": rank}
    try:
        with nanguard.attach(model, opt, policy=policy) as guard:
            for step in range(6):
                opt.zero_grad()
                F.mse_loss(model(data[step]), torch.zeros(8, 1)).backward()
                opt.step()
        result["skipped"] = [r.step for r in guard.history if r.skipped]
        result["recoveries"] = guard.recoveries
        result["findings"] = [(f.rank, f.phase, f.details.get("samples")) for f, _ in guard.findings]
        result["finite"] = all(bool(torch.isfinite(p).all()) for p in model.parameters())
        result["weights"] = [p.detach().sum().item() for p in model.parameters()]
    except nanguard.NonFiniteError as err:
        result["error"] = {"rank": err.finding.rank, "phase": err.finding.phase}
    with open(f"{out}.rank{rank}.json", "w") as fh:
        json.dump(result, fh)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    # skip interpreter teardown: gloo's background threads can abort a process that exits while
    # they wind down ("terminate called without an active exception"); the results are written
    os._exit(0)


if __name__ == "__main__":
    out, policy, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    mp.spawn(worker, args=(2, out, policy, port), nprocs=2, join=True)
