"""Lightning's ``strategy="ddp"`` on CPU (2 processes, gloo; Lightning launches the second one
itself) with ``NanGuardCallback``: a healthy run is left as it is; log(0) on rank 1 alone is found
on both ranks with its op and credited to rank 1, and ``skip`` drops the step on both, the
replicas still one model; each rank's own lines are led by its rank (Lightning's launcher sets no
``WORLD_SIZE``: the rank is read from the process group)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _spawn import Spawn
from test_fsdp import _env

pytest.importorskip("lightning")

_SCRIPT = """
import json, os, torch, torch.nn as nn, torch.nn.functional as F
import lightning.pytorch as pl
from nanguard.integrations.lightning import NanGuardCallback


class Reg(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))

    def training_step(self, batch, idx):
        x, y = batch
        scale = torch.ones_like(y) + 0.5
        if self.global_rank == 1 and self.global_step == 3 and os.environ.get("BAD"):
            scale[2, 0] = 0.0
        return F.mse_loss(self.net(x) * torch.log(scale), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


if __name__ == "__main__":
    torch.manual_seed(0)
    x = torch.randn(256, 4)
    y = x.sum(1, keepdim=True)
    dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    cb = [NanGuardCallback(policy=os.environ["POLICY"])] if os.environ.get("POLICY") else []
    tr = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, callbacks=cb, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    model = Reg()
    try:
        tr.fit(model, dl)
        status = "ok"
    except Exception as e:
        status = type(e).__name__
    out = {"status": status, "sum": sum(p.detach().double().sum().item() for p in model.parameters()),
           "findings": [(f.step, f.rank, f.op) for f, _ in cb[0].findings] if cb else []}
    with open(f"out.rank{tr.global_rank}.json", "w") as fh:
        json.dump(out, fh)
    # torch's own teardown: a process group left to interpreter exit after an exception aborts
    # a rank now and then ("terminate called without an active exception", with or without
    # nanguard); ended here, as a script that stops cleanly does
    import gc, torch.distributed as dist
    del tr, model
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()
"""


def _fit(spawn: Spawn, tmp_path: Path, policy: str | None, bad: bool) -> tuple[list[dict[str, object]], str]:
    (tmp_path / "train.py").write_text(_SCRIPT)
    env = {**_env(), **({"POLICY": policy} if policy else {}), **({"BAD": "1"} if bad else {})}
    proc = spawn.python("train.py", cwd=tmp_path, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((tmp_path / f"out.rank{r}.json").read_text()) for r in (0, 1)], proc.stderr


def test_a_healthy_ddp_fit_is_left_as_it_is(tmp_path: Path, spawn: Spawn) -> None:
    plain, _ = _fit(spawn, tmp_path, None, bad=False)
    guarded, err = _fit(spawn, tmp_path, "raise", bad=False)
    assert [o["sum"] for o in guarded] == [o["sum"] for o in plain]
    assert all(o["status"] == "ok" and o["findings"] == [] for o in guarded)
    assert "nanguard" not in err


@pytest.mark.parametrize("policy", ["raise", "skip"])
def test_a_nan_made_on_one_rank_is_found_on_both_and_acted_on_alike(
        tmp_path: Path, spawn: Spawn, policy: str) -> None:
    outs, err = _fit(spawn, tmp_path, policy, bad=True)
    for o in outs:
        assert o["findings"] == [[3, 1, "aten.log.default"]]
        assert o["status"] == ("NonFiniteError" if policy == "raise" else "ok")
    assert outs[0]["sum"] == outs[1]["sum"]  # one model on both ranks
    if policy == "skip":
        assert "[rank 0] nanguard: step 3: unsafe-op → skip" in err
        assert "[rank 1] nanguard: step 3: unsafe-op → skip" in err
