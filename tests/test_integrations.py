"""The Lightning and Hugging Face callbacks, against the real packages (tiny models, no downloads)."""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nanguard
from _spawn import Spawn

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may be downloaded: models are built from configs
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _finite(model: nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


# ----------------------------------------------------------------------------------------------
# PyTorch Lightning

pl = pytest.importorskip("lightning.pytorch")
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402


class _Log(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)  # ReLU outputs are often exactly 0


class Regressor(pl.LightningModule):  # type: ignore[misc]
    def __init__(self, lr: float = 0.05, log0: bool = False) -> None:
        super().__init__()
        self.lr = lr
        layers: OrderedDict[str, nn.Module] = OrderedDict(
            fc1=nn.Linear(4, 32), act=nn.ReLU(), fc2=nn.Linear(32, 32), act2=nn.ReLU())
        if log0:
            layers["log"] = _Log()
        layers["head"] = nn.Linear(32, 1)
        self.net = nn.Sequential(layers)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def _data(nan_at: int | None = None, n: int = 64) -> DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    y = x.sum(1, keepdim=True)
    if nan_at is not None:
        x[nan_at, 2] = float("nan")
    return DataLoader(TensorDataset(x, y), batch_size=8)


def _trainer(cb: Any, **kw: Any) -> Any:
    kw.setdefault("max_steps", 8)
    return pl.Trainer(callbacks=[cb], logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                      devices=1, **kw)


def test_lightning_nan_sample_is_caught_before_the_update(tmp_path: Path) -> None:
    from nanguard.integrations.lightning import NanGuardCallback

    model = Regressor()
    cb = NanGuardCallback(report_path=str(tmp_path / "r.html"))
    trainer = _trainer(cb)
    before = None

    class Keep(pl.Callback):  # type: ignore[misc]
        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, i: int) -> None:
            nonlocal before
            before = [p.detach().clone() for p in pl_module.parameters()]

    trainer.callbacks.append(Keep())
    with pytest.raises(nanguard.NonFiniteError) as info:
        trainer.fit(model, _data(nan_at=13))
    f, d = info.value.finding, info.value.diagnosis
    assert (f.phase, f.op, f.step) == ("data", "input", 1)
    assert f.source is not None and "test_integrations.py:" in f.source  # training_step's line
    assert d is not None and d.cause.value == "nonfinite-input"
    assert f.details["samples"][0]["index"] == 5  # sample 13 = item 5 of the second batch
    assert _finite(model) and trainer.global_step == 1
    assert before is not None and all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    html = (tmp_path / "r.html").read_text()
    assert "nonfinite-input" in html and "stopped on a non-finite value" in html


@pytest.mark.parametrize("policy", ["raise", "recover"])
def test_lightning_accumulation_replays_every_micro_batch(policy: str) -> None:
    # the NaN sits in the FIRST micro-batch of optimizer step 1 (batches 2 and 3): a replay of
    # the last micro-batch alone would find nothing and guess
    from nanguard.integrations.lightning import NanGuardCallback

    model = Regressor()
    cb = NanGuardCallback(policy=policy)
    trainer = _trainer(cb, accumulate_grad_batches=2, max_steps=4)
    if policy == "raise":
        with pytest.raises(nanguard.NonFiniteError) as info:
            trainer.fit(model, _data(nan_at=2 * 8 + 6))
        f, d = info.value.finding, info.value.diagnosis
    else:
        trainer.fit(model, _data(nan_at=2 * 8 + 6))
        f, d = cb.findings[0]
        assert [r["action"] for r in cb.recoveries] == ["drop_batch"]
    assert (f.phase, f.op, f.step) == ("data", "input", 1)
    assert f.details["micro_batch"] == "1 of 2 (batch_idx 2)" and f.details["samples"][0]["index"] == 6
    assert d is not None and d.cause.value == "nonfinite-input"
    assert _finite(model)


def test_lightning_unsafe_log_under_mixed_precision_and_clipping() -> None:
    """Mixed precision (bf16-mixed: CPU has no fp16 AMP) and Lightning's own gradient clipping:
    the check runs before the clipping, and the replay runs under the same autocast, so the
    log(0) is reported at its op, in its module."""
    from nanguard.integrations.lightning import NanGuardCallback

    model = Regressor(log0=True)
    cb = NanGuardCallback()
    with pytest.raises(nanguard.NonFiniteError) as info:
        _trainer(cb, precision="bf16-mixed", gradient_clip_val=1.0).fit(model, _data())
    f, d = info.value.finding, info.value.diagnosis
    assert (f.phase, f.op, f.module, f.module_type, f.step) == (
        "forward", "aten.log.default", "net.log", "_Log", 0)
    assert d is not None and d.cause.value == "unsafe-op"
    assert _finite(model)


def test_lightning_recover_rolls_back_and_finishes(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A learning rate far too high: `recover` rolls back to the last snapshot, backs off the
    learning rate, and the run finishes with finite weights — saying so as `nanguard run` does:
    a line at the event, the summary and the verdict at the end (also in the run log)."""
    import json

    from nanguard.integrations.lightning import NanGuardCallback

    model = Regressor(lr=4.0)
    cb = NanGuardCallback(policy="recover", report_path=str(tmp_path / "r.html"),
                          json_path=str(tmp_path / "r.json"))
    trainer = _trainer(cb, max_steps=40, max_epochs=-1)
    trainer.fit(model, _data(n=128))
    assert trainer.global_step == 40
    assert _finite(model)
    assert cb.findings and cb.findings[0][1].cause.value in (
        "learning-rate-too-high", "exploding-gradients")
    assert any(r["action"] == "rollback" for r in cb.recoveries)
    html = (tmp_path / "r.html").read_text()
    assert "rollback" in html
    err = capfd.readouterr().err
    step = cb.recoveries[0]["step"]
    assert f"nanguard: step {step}: {cb.recoveries[0]['cause']} → rollback" in err
    assert "nanguard: the run finished after 40 steps; it met non-finite values" in err
    assert "  outcome: " in err
    log = json.loads((tmp_path / "r.json").read_text())
    assert log["outcome"] is not None and log["outcome"] == cb.outcome
    assert log["status"] == {"not-recovered": "not-recovered", "unjudged": "unjudged"}.get(
        log["outcome"]["status"], "recovered")


class _Eps0(Regressor):
    """Adam with eps=0 and one dead input: 0/0 in the update makes that weight column NaN."""

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3, eps=0.0)


def test_lightning_skip_undoes_an_update_that_made_the_weights_nonfinite() -> None:
    from nanguard.integrations.lightning import NanGuardCallback

    torch.manual_seed(0)
    model = _Eps0()
    x = torch.randn(64, 4)
    x[:, 1] = 0.0  # a dead feature: its weights get exactly zero gradient
    y = x.sum(1, keepdim=True)
    cb = NanGuardCallback(policy="skip")
    with pytest.raises(nanguard.GiveUpError):  # skipping cannot fix eps=0: it gives up, finite
        _trainer(cb, max_steps=30, max_epochs=-1).fit(model, DataLoader(TensorDataset(x, y), batch_size=8))
    assert _finite(model)  # the guarantee: no non-finite update stayed applied
    assert cb.findings[0][0].phase == "optimizer" and cb.findings[0][1].cause.value == "optimizer-state"
    assert cb.recoveries[0]["restored_step"] == 0


_LIGHTNING_SCRIPT = """
import torch, torch.nn as nn, torch.nn.functional as F
import lightning.pytorch as pl
from torch.utils.data import DataLoader, TensorDataset

class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    def training_step(self, batch, i):
        x, y = batch
        out = self.net(x)
        scale = out.abs().sum() * (0.0 if self.global_step == 3 else 1.0)
        return F.mse_loss(out, y) / scale
    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)

torch.manual_seed(0)
x = torch.randn(64, 4)
pl.Trainer(max_steps=8, logger=False, enable_checkpointing=False, enable_progress_bar=False,
           enable_model_summary=False, accelerator="cpu", devices=1).fit(
    Model(), DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8))
"""


def test_unmodified_lightning_script_under_nanguard_run_is_checked_after_the_closure(
        tmp_path: Path, spawn: Spawn) -> None:
    import json
    import textwrap

    script = tmp_path / "pl_div0.py"
    script.write_text(textwrap.dedent(_LIGHTNING_SCRIPT))
    out = spawn.nanguard("run", "--json", str(tmp_path / "r.json"), str(script), timeout=600,
                         cwd=tmp_path)
    assert out.returncode == 3, out.stderr[-2000:]
    ev = json.loads((tmp_path / "r.json").read_text())["events"][0]
    assert (ev["op"], ev["phase"], ev["cause"], ev["step"]) == ("aten.div.Tensor", "forward", "unsafe-op", 3)


# ----------------------------------------------------------------------------------------------
# Hugging Face transformers

transformers = pytest.importorskip("transformers")


def _args(tmp_path: Path, **kw: Any) -> Any:
    return transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=8,
        report_to=[], logging_steps=1, use_cpu=True, save_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0, seed=0, **kw)


def _gpt2() -> Any:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=32, n_positions=8,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg)


def _embeds(nan_at: int = 21) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    data = []
    for i in range(32):
        e = torch.randn(8, 16, generator=g)
        if i == nan_at:
            e[3, 5] = float("nan")
        data.append({"inputs_embeds": e, "labels": torch.randint(0, 32, (8,), generator=g)})
    return data


def test_hf_trainer_alone_hides_the_nan_and_corrupts_the_weights(tmp_path: Path) -> None:
    """The premise: logging_nan_inf_filter keeps the logged loss finite while the weights die."""
    model = _gpt2()
    trainer = transformers.Trainer(model=model, args=_args(tmp_path), train_dataset=_embeds())
    trainer.train()
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert all(torch.isfinite(torch.tensor(v)) for v in logged)
    assert not _finite(model)


def test_hf_callback_raises_at_the_nan_sample_and_keeps_weights_finite(tmp_path: Path) -> None:
    from nanguard.integrations.huggingface import NanGuardCallback

    model = _gpt2()
    trainer = transformers.Trainer(model=model, args=_args(tmp_path), train_dataset=_embeds(),
                                   callbacks=[NanGuardCallback()])
    with pytest.raises(nanguard.NonFiniteError) as info:
        trainer.train()
    f, d = info.value.finding, info.value.diagnosis
    assert (f.phase, f.op) == ("data", "input")
    assert d is not None and d.cause.value == "nonfinite-input"
    assert [tuple(x) for x in f.details["samples"][0]["features"]] == [(3, 5)]
    assert _finite(model)
    assert f.step == trainer.state.global_step  # the bad step was never taken


def test_hf_callback_recover_says_what_it_did(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """``recover`` drops the batch with the NaN sample — one line as it happens — and the end of
    training prints the summary and the verdict, as ``nanguard run`` does (never silent)."""
    from nanguard.integrations.huggingface import NanGuardCallback

    model = _gpt2()
    cb = NanGuardCallback(policy="recover")
    trainer = transformers.Trainer(model=model, args=_args(tmp_path), train_dataset=_embeds(),
                                   callbacks=[cb])
    trainer.train()
    assert _finite(model)
    (rec,) = cb.recoveries
    assert rec["action"] == "drop_batch" and rec["cause"] == "nonfinite-input"
    err = capfd.readouterr().err
    assert f"nanguard: step {rec['step']}: nonfinite-input → drop batch" in err
    assert "nanguard: the run finished after 8 steps; it met non-finite values at 1 step (policy recover):" in err
    assert "  outcome: " in err


class _LogNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.act = _Log()
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        out = self.head(self.act(self.fc(x).relu()))
        return {"loss": F.mse_loss(out, labels), "logits": out}


def test_hf_callback_stop_names_the_log_and_stops(tmp_path: Path) -> None:
    from nanguard.integrations.huggingface import NanGuardCallback

    torch.manual_seed(0)
    model = _LogNet()
    g = torch.Generator().manual_seed(0)
    data = [{"x": torch.randn(4, generator=g), "labels": torch.randn(1, generator=g)}
            for _ in range(32)]
    cb = NanGuardCallback(policy="stop", report_path=str(tmp_path / "r.html"))
    trainer = transformers.Trainer(model=model, args=_args(tmp_path), train_dataset=data,
                                   callbacks=[cb])
    trainer.train()  # returns: training stopped, not crashed
    assert trainer.state.global_step < 8
    f, d = cb.findings[0]
    assert (f.phase, f.op, f.module, f.module_type) == ("forward", "aten.log.default", "act", "_Log")
    assert d.cause.value == "unsafe-op"
    assert _finite(model)
    assert cb.guard is None  # detached when training ended
    assert "aten.log.default" in (tmp_path / "r.html").read_text()
