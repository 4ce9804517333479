"""DDP with gloo, 2 processes: one rank's NaN makes every rank act on the same step."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from _spawn import Spawn

HERE = Path(__file__).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(spawn: Spawn, tmp_path: Path, policy: str) -> list[dict[str, object]]:
    out = tmp_path / "ddp"
    proc = spawn.python(str(HERE / "ddp_worker.py"), str(out), policy, str(_free_port()), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((tmp_path / f"ddp.rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.parametrize("policy", ["skip", "recover"])
def test_every_rank_skips_the_same_step(tmp_path: Path, policy: str, spawn: Spawn) -> None:
    r0, r1 = _run(spawn, tmp_path, policy)
    assert r0["skipped"] == r1["skipped"] == [2]
    for r in (r0, r1):
        assert r["finite"] is True
        (finding,) = r["findings"]
        assert finding[0] == 1 and finding[1] == "data"  # both name rank 1
    assert r0["weights"] == r1["weights"]  # still in sync


def test_raise_stops_every_rank_without_hanging(tmp_path: Path, spawn: Spawn) -> None:
    r0, r1 = _run(spawn, tmp_path, "raise")
    assert r0["error"] == r1["error"] == {"rank": 1, "phase": "data"}


_TORCHRUN_SCRIPT = """
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(rank)
for step in range(6):
    x = torch.randn(16, 4, generator=g)
    if rank == 1 and step == 2:
        x[5, 1] = float("nan")
    opt.zero_grad()
    F.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
    opt.step()
dist.destroy_process_group()
"""


def test_torchrun_ranks_keep_their_own_run_logs_and_report_merges_them(
        tmp_path: Path, spawn: Spawn) -> None:
    (tmp_path / "train.py").write_text(_TORCHRUN_SCRIPT)
    proc = spawn.python(
        "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
        "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
        "-m", "nanguard", "run", "--json", "run.json", "train.py",
        timeout=300, cwd=tmp_path,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode != 0  # the ranks stopped with exit status 3
    r0 = json.loads((tmp_path / "run.json").read_text())
    r1 = json.loads((tmp_path / "run.rank1.json").read_text())
    assert (r0["rank"], r1["rank"], r0["world_size"]) == (0, 1, 2)
    for log in (r0, r1):  # both ranks stopped on the same step, on rank 1's bad sample
        assert log["status"] == "nonfinite" and log["exit_code"] == 3
        assert [(e["step"], e["rank"], e["cause"]) for e in log["events"]] == [(2, 1, "nonfinite-input")]
    from nanguard.core.ranks import merge_ranks

    merged = merge_ranks(str(tmp_path / "run.json"))
    assert [x["rank"] for x in merged["ranks"]] == [0, 1] and merged["status"] == "nonfinite"
    assert any(n.startswith("rank 1: nonfinite") for n in merged["notes"])
    rep = spawn.nanguard("report", "run.json", "-o", "r.html", timeout=120, cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    assert "rank 1: nonfinite" in (tmp_path / "r.html").read_text()
