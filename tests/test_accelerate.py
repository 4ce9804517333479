"""Hugging Face accelerate's loop under ``torchrun -m nanguard run``, 2 processes on gloo (CPU):
``accelerator.prepare`` (DDP and a sharded loader), gradient accumulation, ``accelerator.backward``
and ``accelerator.clip_grad_norm_``. A healthy run is left bit for bit as it is; a NaN sample in
one rank's shard of the data is found on every rank, credited to that rank, at the script's own
line (not accelerate's ``.to(device)``), and skipped on both with the replicas still equal."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from _spawn import Spawn
from test_fsdp import _env, _port

pytest.importorskip("accelerate")

_SCRIPT = """
import json, os, torch, torch.nn as nn, torch.nn.functional as F
from accelerate import Accelerator
acc = Accelerator(cpu=True, gradient_accumulation_steps=2)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
g = torch.Generator().manual_seed(0)
x = torch.randn(256, 4, generator=g)
y = x.sum(1, keepdim=True)
if os.environ.get("BAD"):
    x[37, 2] = float("nan")  # one sample, in one rank's shard
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
model, opt, loader = acc.prepare(model, opt, loader)
for epoch in range(2):
    for i, (xb, yb) in enumerate(loader):
        with acc.accumulate(model):
            scale = torch.full_like(yb, 1.5)
            if os.environ.get("LOGZERO") and acc.process_index == 1 and (epoch, i) == (1, 2):
                scale[3, 0] = 0.0  # log(0) on rank 1 alone
            loss = F.mse_loss(model(xb) * torch.log(scale), yb)
            acc.backward(loss)
            if acc.sync_gradients:
                acc.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
        losses = acc.gather(loss.detach()[None])  # every rank's loss for the log: the script's own collective
    acc.print("epoch", epoch, "loss", round(loss.item(), 6), "ranks", losses.tolist())
total = sum(p.detach().double().sum().item() for p in model.parameters())
finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
with open(f"weights.rank{acc.process_index}.json", "w") as fh:
    json.dump({"finite": finite, "sum": total}, fh)
# torch's own teardown: a DDP model still alive when the process group ends (end_training) or at
# interpreter exit aborts a rank now and then, plain or guarded ("terminate called without an
# active exception"); freed first, as tests/test_fsdp.py's script does
import gc
acc.free_memory()
del model, opt, loader
gc.collect()
acc.end_training()
"""


def _launch(spawn: Spawn, tmp_path: Path, *nanguard: str, bad: bool = False,
            log_zero: bool = False) -> tuple[int, str, str]:
    (tmp_path / "train.py").write_text(_SCRIPT)
    head = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_port())]
    cmd = [*head, "-m", "nanguard", "run", *nanguard, "train.py"] if nanguard else [*head, "train.py"]
    env = {**_env(), **({"BAD": "1"} if bad else {}), **({"LOGZERO": "1"} if log_zero else {})}
    proc = spawn.run(cmd, cwd=tmp_path, timeout=300, env=env)
    return proc.returncode, proc.stdout, proc.stderr


def _weights(tmp_path: Path) -> list[dict[str, object]]:
    return [json.loads((tmp_path / f"weights.rank{r}.json").read_text()) for r in (0, 1)]


def test_a_healthy_accelerate_run_is_left_as_it_is(tmp_path: Path, spawn: Spawn) -> None:
    rc, plain, err = _launch(spawn, tmp_path)
    assert rc == 0, err[-2000:]
    before = _weights(tmp_path)
    rc, guarded, err = _launch(spawn, tmp_path, "--json", "run.json")
    assert rc == 0, err[-3000:]
    assert plain == guarded and "epoch 1 loss" in plain  # the losses printed, bit for bit
    assert _weights(tmp_path) == before
    for name in ("run.json", "run.rank1.json"):
        log = json.loads((tmp_path / name).read_text())
        assert log["status"] == "ok" and not log["events"] and log["steps"] == 8  # 16 batches, 2 per step


def test_a_nan_sample_in_one_ranks_shard_is_found_and_skipped_on_every_rank(
        tmp_path: Path, spawn: Spawn) -> None:
    rc, _, err = _launch(spawn, tmp_path, "--policy", "skip", "--json", "run.json", bad=True)
    assert rc == 0, err[-3000:]
    w0, w1 = _weights(tmp_path)
    assert w0["finite"] and w1["finite"] and w0["sum"] == w1["sum"]  # the replicas are one model
    events = [json.loads((tmp_path / n).read_text())["events"] for n in ("run.json", "run.rank1.json")]
    assert [(e["step"], e["rank"], e["cause"]) for e in events[0]] == [
        (e["step"], e["rank"], e["cause"]) for e in events[1]]
    for e in events[0]:  # every pass over the data meets the row again
        assert (e["phase"], e["cause"], e["source"]) == ("data", "nonfinite-input", "train.py:16"), e
    # row 37 sits in one rank's shard (accelerate splits each batch of 16 rows between the ranks)
    assert len({e["rank"] for e in events[0]}) == 1 and len(events[0]) == 2


@pytest.mark.parametrize("policy", ["raise", "skip"])
def test_a_log_of_zero_on_one_rank_is_named_past_the_scripts_own_gather(
        tmp_path: Path, spawn: Spawn, policy: str) -> None:
    """The script gathers every rank's loss for its log (``accelerator.gather``): that collective
    is in the step's tape. A replay or a trial that ran it again on one rank paired it with
    another rank's unrelated collective (gloo aborted the job: 'collective mismatch'); it is now
    never run again, and the replay, which does not need it, names the op on rank 1."""
    rc, _, err = _launch(spawn, tmp_path, "--policy", policy, "--json", "run.json", log_zero=True)
    assert (rc == 0) == (policy == "skip"), err[-3000:]
    for name in ("run.json", "run.rank1.json"):
        (event,) = json.loads((tmp_path / name).read_text())["events"]
        assert (event["rank"], event["phase"], event["op"], event["cause"]) == (
            1, "forward", "aten.log.default", "unsafe-op"), event
    if policy == "skip":
        w0, w1 = _weights(tmp_path)
        assert w0["finite"] and w1["finite"] and w0["sum"] == w1["sum"]
