"""FSDP2 (``fully_shard``, DTensor weights and gradients) and DDP under ``torchrun -m nanguard
run``, 2 processes on gloo: a healthy run is left as it is (FSDP2 crashed in the watch's check
before), a learning rate far too high is found on every rank, with its op and cause, without a
hang, and ``--policy recover`` takes one decision on every rank (the same back-off, the same
trials — on FSDP2 too), the weights finite on each and a DDP model's replicas still equal."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from _spawn import Spawn

pytest.importorskip("torch.distributed.fsdp")

_SCRIPT = """
import gc, json, os, torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
for m in model:
    if isinstance(m, nn.Linear):
        fully_shard(m)
fully_shard(model)
opt = torch.optim.SGD(model.parameters(), lr=float(os.environ["LR"]))
g = torch.Generator().manual_seed(rank)
for step in range(int(os.environ.get("STEPS", "12"))):
    x = torch.randn(32, 16, generator=g)
    opt.zero_grad()
    loss = F.mse_loss(model(x), x.sum(1, keepdim=True))
    loss.backward()
    opt.step()
    if rank == 0:
        print("step", step, "loss", round(loss.item(), 4), flush=True)
finite = all(bool(torch.isfinite(p.full_tensor() if hasattr(p, "full_tensor") else p).all())
             for p in model.parameters())
total = sum(float(p.detach().double().sum()) for p in model.parameters()) if not hasattr(model, "reshard") else None
with open(f"weights.rank{rank}.json", "w") as fh:  # each rank its own file: the ranks share stdout
    json.dump({"finite": finite, "sum": total}, fh)  # the sum: a DDP replica's weights
# torch's own teardown: left to interpreter exit, the FSDP2 state aborts rank 0 in about one plain
# run in four ("terminate called without an active exception", after destroy_process_group, with
# or without nanguard); freed before, 0 aborts in 25 plain and 20 guarded runs
del model, opt
gc.collect()
dist.destroy_process_group()
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_DDP = """
for m in model:
    if isinstance(m, nn.Linear):
        fully_shard(m)
fully_shard(model)
""", """
model = torch.nn.parallel.DistributedDataParallel(model)
"""


def _torchrun(spawn: Spawn, tmp_path: Path, lr: float, guarded: bool, *flags: str, steps: int = 12,
              ddp: bool = False) -> tuple[int, str, str]:
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT.replace(*_DDP) if ddp else _SCRIPT)
    head = ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_port())]
    tail = ["-m", "nanguard", "run", *flags, "--json", str(tmp_path / "run.json"), str(script)] if guarded \
        else [str(script)]
    proc = spawn.run([sys.executable, *head, *tail], cwd=tmp_path,
                     env={**_env(), "LR": str(lr), "STEPS": str(steps)})
    return proc.returncode, proc.stdout, proc.stderr


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("NANGUARD_")} | {"OMP_NUM_THREADS": "1"}


def test_a_healthy_fsdp2_run_is_left_as_it_is(tmp_path: Path, spawn: Spawn) -> None:
    rc, plain, err = _torchrun(spawn, tmp_path, 0.01, guarded=False)
    assert rc == 0, err[-2000:]
    rc, guarded, err = _torchrun(spawn, tmp_path, 0.01, guarded=True)
    assert rc == 0, err[-3000:]
    steps = [[line for line in o.splitlines() if line.startswith("step ")] for o in (plain, guarded)]
    assert len(steps[0]) == 12 and steps[0] == steps[1]  # the same losses, bit for bit
    for name in ("run.json", "run.rank1.json"):
        log = json.loads((tmp_path / name).read_text())
        assert log["status"] == "ok" and log["steps"] == 12 and not log["events"]
        norms = [h["grad_norm"] for h in log["history"]]
        assert all(isinstance(v, float) and v > 0 for v in norms)  # sharded gradients are checked
    r0, r1 = (json.loads((tmp_path / n).read_text()) for n in ("run.json", "run.rank1.json"))
    # the norms are the global ones (the shards' squares summed across the mesh): the same on
    # every rank, although each rank holds half of each weight
    assert [h["grad_norm"] for h in r0["history"]] == pytest.approx([h["grad_norm"] for h in r1["history"]])
    # and the losses are the mean of the ranks' (each rank's batch is its own): the outcome of a
    # recovery is judged the same on every rank
    assert [h["loss"] for h in r0["history"]] == [h["loss"] for h in r1["history"]]
    assert r0["history"][0]["loss"] != pytest.approx(float(plain.split()[3]))  # not rank 0's alone


def test_a_learning_rate_far_too_high_is_found_on_every_rank(tmp_path: Path, spawn: Spawn) -> None:
    rc, _, err = _torchrun(spawn, tmp_path, 50.0, guarded=True)
    # rank 0 prints the finding once, naming the rank; rank 1 one line of its own, its rank first
    assert rc != 0 and err.count("first non-finite value was made") == 1, err[-3000:]
    assert "made in the forward pass at step 2 on rank 0." in err
    assert ("[rank 1] nanguard: stopped at step 2 on a non-finite value made on rank 0 "
            "(`aten.mse_loss.default`, forward pass; learning-rate-too-high): rank 0 prints the finding; "
            f"this rank's run log: {tmp_path / 'run.rank1.json'}\n") in err
    # the early warnings, one line each (a line written in two parts came out cut by the other rank's)
    warnings = [line for line in err.splitlines() if "nanguard: warning at step" in line]
    assert sorted(w[:8] for w in warnings) == ["[rank 0]", "[rank 1]"], warnings
    assert all(w.count("nanguard:") == 1 for w in warnings)
    for name in ("run.json", "run.rank1.json"):
        log = json.loads((tmp_path / name).read_text())
        assert log["status"] == "nonfinite"
        event = log["events"][0]
        assert event["cause"] == "learning-rate-too-high"
        assert (event["phase"], event["step"], event["rank"]) == ("forward", 2, 0)


def _weights(tmp_path: Path) -> list[dict[str, object]]:
    return [json.loads((tmp_path / f"weights.rank{r}.json").read_text()) for r in (0, 1)]


def _recoveries(tmp_path: Path) -> list[list[tuple[object, ...]]]:
    out = []
    for name in ("run.json", "run.rank1.json"):
        log = json.loads((tmp_path / name).read_text())
        assert log["status"] == "recovered" and log["steps"] == 60, log["status"]
        out.append([(r["step"], r["action"], r["lr_scale"], r.get("verified")) for r in log["recoveries"]])
    return out


def test_fsdp2_recovers_with_one_back_off_on_every_rank(tmp_path: Path, spawn: Spawn) -> None:
    rc, _, err = _torchrun(spawn, tmp_path, 1.0, True, "--policy", "recover", steps=60)
    assert rc == 0, err[-3000:]
    assert all(w["finite"] for w in _weights(tmp_path))
    r0, r1 = _recoveries(tmp_path)
    # each rank measured its own shard's update/weight ratio (×0.0094 and ×0.0083 before): one
    # back-off now; FSDP2's weights get their gradients from its own hooks, so the trial's re-run
    # is a real backward on both ranks at once, its turns agreed (it was applied untried before)
    assert r0 == r1 and len(r0) == 1 and r0[0][1] == "rollback" and r0[0][3] is True, (r0, r1)
    assert err.count("(verified)") == 1 and "applied untried" not in err, err[-3000:]
    # the gradient norms the decision read are the global ones on both ranks, also where they
    # grew past float32's squares (1e21: each rank read its own shard's norm before)
    h0, h1 = (json.loads((tmp_path / n).read_text())["history"] for n in ("run.json", "run.rank1.json"))
    norms = [[h["grad_norm"] for h in h if isinstance(h["grad_norm"], float)] for h in (h0, h1)]
    assert max(norms[0]) > 1e19 and norms[0] == pytest.approx(norms[1], rel=1e-6)


def test_ddp_recovers_with_the_same_verified_fix_and_equal_replicas(tmp_path: Path, spawn: Spawn) -> None:
    rc, _, err = _torchrun(spawn, tmp_path, 1.0, True, "--policy", "recover", steps=60, ddp=True)
    assert rc == 0, err[-3000:]
    r0, r1 = _recoveries(tmp_path)
    assert r0 == r1 and len(r0) == 1 and r0[0][1] == "rollback" and r0[0][3] is True, (r0, r1)
    # the trials agreed: both ranks' losses summed, every fix tried, listed up to the first verified
    assert err.count("(verified)") == 1, err[-3000:]
    w0, w1 = _weights(tmp_path)
    assert w0["finite"] and w1["finite"]
    assert w0["sum"] == w1["sum"], (w0, w1)  # DDP's replicas are still one model


_ONE_RANK = """
import gc, json, os, torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, x, scale):
        pre = self.body(x)
        if os.environ["KIND"] == "log":
            return pre * torch.log(scale)  # forward: log(0) = -inf
        return torch.sqrt(pre * pre * (scale != 0))  # backward: sqrt's derivative at 0


model = Net()
if os.environ["MODE"] == "ddp":
    model = nn.parallel.DistributedDataParallel(model)
else:
    for m in model.body:
        if isinstance(m, nn.Linear):
            fully_shard(m)
    fully_shard(model)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(rank)
for step in range(8):
    x = torch.randn(16, 4, generator=g)
    scale = torch.rand(16, 1, generator=g) + 1.5
    if rank == 1 and step == 3:
        scale[5, 0] = 0.0  # this rank's batch only
    opt.zero_grad()
    F.mse_loss(model(x, scale), x.sum(1, keepdim=True)).backward()
    opt.step()
full = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()]
with open(f"weights.rank{rank}.json", "w") as fh:
    json.dump({"finite": all(bool(torch.isfinite(p).all()) for p in full),
               "sum": float(sum(p.detach().double().sum() for p in full))}, fh)
del model, opt, full
gc.collect()
dist.destroy_process_group()
"""


def _one_rank(spawn: Spawn, tmp_path: Path, mode: str, kind: str, policy: str, *flags: str) -> tuple[int, str]:
    script = tmp_path / "train.py"
    script.write_text(_ONE_RANK)
    proc = spawn.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                      "--master_port", str(_port()), "-m", "nanguard", "run", *flags, "--policy", policy,
                      "--json", str(tmp_path / "run.json"), str(script)],
                     cwd=tmp_path, timeout=300, env={**_env(), "MODE": mode, "KIND": kind})
    return proc.returncode, proc.stderr


@pytest.mark.parametrize("mode,policy", [("fsdp2", "raise"), ("fsdp2", "skip"), ("fsdp2", "recover"),
                                         ("ddp", "skip")])
def test_a_nan_made_on_one_rank_is_credited_to_it_with_its_op(
        tmp_path: Path, spawn: Spawn, mode: str, policy: str) -> None:
    """Rank 1 alone meets log(0); rank 0 is healthy. FSDP2's forward all-gathers: a replay on
    rank 1 alone waited on rank 0 (gloo aborted the job: 'collective mismatch'); now the modules
    are gathered on every rank and the replay runs with no collective."""
    rc, err = _one_rank(spawn, tmp_path, mode, "log", policy)
    for name in ("run.json", "run.rank1.json"):
        log = json.loads((tmp_path / name).read_text())
        (event,) = log["events"]
        assert (event["step"], event["rank"], event["phase"], event["op"], event["cause"]) == (
            3, 1, "forward", "aten.log.default", "unsafe-op"), event
        assert event["module_type"] == "Net"  # the user's class, not FSDP2's FSDPNet
    if policy == "skip":
        assert rc == 0, err[-3000:]
        w0, w1 = _weights(tmp_path)
        assert w0["finite"] and w1["finite"] and w0["sum"] == w1["sum"]
        for name in ("run.json", "run.rank1.json"):
            assert [r["step"] for r in json.loads((tmp_path / name).read_text())["recoveries"]] == [3]
    else:  # an unsafe op has no blind fix: recover stops like raise, on both ranks, in time
        assert rc != 0 and err.count("first non-finite value was made in the forward pass at step 3 on rank 1") == 1
        assert "found on rank 1; rank 0 received it" in err, err[-3000:]


def test_a_nan_made_in_one_ranks_backward_is_found_there_under_fsdp2(tmp_path: Path, spawn: Spawn) -> None:
    """The gradient reduce-scatter spreads rank 1's NaN gradient to rank 0's shard: both ranks
    fail the check, both replay on their own, and only rank 1's replay names the op."""
    rc, err = _one_rank(spawn, tmp_path, "fsdp2", "sqrt", "raise")
    assert rc != 0 and "found on rank 1; rank 0 received it" in err, err[-3000:]
    for name in ("run.json", "run.rank1.json"):
        (event,) = json.loads((tmp_path / name).read_text())["events"]
        assert (event["step"], event["rank"], event["phase"], event["op"], event["grad_fn"]) == (
            3, 1, "backward", "aten.div.Tensor", "SqrtBackward0"), event


@pytest.mark.parametrize("mode,kind,op", [("fsdp2", "log", "aten.log.default"), ("ddp", "sqrt", "aten.div.Tensor")])
def test_trace_under_torchrun_waits_for_the_step_check_of_every_rank(
        tmp_path: Path, spawn: Spawn, mode: str, kind: str, op: str) -> None:
    """``--trace`` raised at the op on the rank that made it, alone: torchrun then killed the other
    rank, which printed no finding (without torchrun it waited in a collective). Under a process
    group the tracer records, and the step's check, agreed by every rank, acts on its finding; a
    value the gradient all-reduce brought to rank 0 (met untracked by its tracer) is not rank 0's."""
    rc, err = _one_rank(spawn, tmp_path, mode, kind, "raise", "--trace")
    assert rc != 0 and "found on rank 1; rank 0 received it" in err, err[-3000:]
    for name in ("run.json", "run.rank1.json"):
        log = json.loads((tmp_path / name).read_text())
        assert log["status"] == "nonfinite" and log["exit_code"] == 3
        (event,) = log["events"]
        assert (event["step"], event["rank"], event["op"], event["detected_by"]) == (3, 1, op, "trace"), event
