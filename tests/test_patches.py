"""Every attribute nanguard patches while a guard is attached is put back by ``detach()``, and
the caches that were only valid meanwhile are dropped (``nanguard.core.patches``)."""

from __future__ import annotations

import types
import warnings
from typing import Any

import torch
import torch.nn.functional as F
import torch.nn.modules.module as _module
import torch.optim.optimizer as _optim
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import nanguard
from nanguard.core.patches import left_patched


def _tables() -> dict[str, Any]:
    """What a guard may touch, by identity: module attributes, class attributes, global hook
    tables, TorchScript's builtin table."""
    from torch.amp import grad_scaler
    from torch.jit import _builtins
    from torch.optim import lr_scheduler
    from torch.utils.data import dataloader

    owners: dict[str, Any] = {
        "F": F, "autograd": torch.autograd, "Module": nn.Module, "Optimizer": torch.optim.Optimizer,
        "loader_iter": dataloader._BaseDataLoaderIter, "record_function": torch.autograd.profiler.record_function,
        "LRScheduler": lr_scheduler.LRScheduler, "GradScaler": grad_scaler.GradScaler,
        "nn.utils": torch.nn.utils, "clip_grad": torch.nn.utils.clip_grad, "warnings": warnings,
    }
    out: dict[str, Any] = {}
    for key, owner in owners.items():
        for name, value in list(vars(owner).items()):
            if not isinstance(value, types.ModuleType):  # torch imports submodules lazily
                out[f"{key}.{name}"] = value
    for name in dir(_module):
        if name.startswith("_global_") and isinstance(getattr(_module, name), dict):
            out[f"module.{name}"] = tuple(getattr(_module, name))
    out["optimizer pre-hooks"] = tuple(_optim._global_optimizer_pre_hooks)
    out["optimizer post-hooks"] = tuple(_optim._global_optimizer_post_hooks)
    from nanguard.core import transparent

    table = _builtins._get_builtin_table()
    out["jit builtin: nanguard's warn"] = table.get(id(transparent.thin_warn()))
    return out


def _train(guard_kw: dict[str, Any]) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.StepLR(opt, 10)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=16)
    with nanguard.attach(model, opt, **guard_kw):
        for x, y in loader:  # steps 1 and 2 are sampled by the hazard look (its global hooks)
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            scaler.scale(loss).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
            sched.step()


def test_detach_puts_back_every_patched_attribute_and_drops_its_caches() -> None:
    before = _tables()
    for policy in ("raise", "recover"):
        _train({"policy": policy})
    after = _tables()
    changed = sorted(k for k in set(before) | set(after) if before.get(k) is not after.get(k)
                     and before.get(k) != after.get(k))
    assert changed == [], f"left behind by detach(): {changed}"
    assert left_patched() == []
    from nanguard.torch import _modules, _patches

    assert len(_modules._NAMES) == 0 and len(_patches._steps_seen) == 0


def test_left_patched_names_what_is_in_place_while_attached() -> None:
    model = nn.Linear(2, 1)
    with nanguard.attach(model, torch.optim.SGD(model.parameters(), lr=0.1)):
        held = left_patched()
        assert any("Module.__call__" in line for line in held)
        assert any("torch.autograd" in line and ".backward" in line for line in held)
        assert any("clip_grad_norm_" in line for line in held)
        assert any("warnings" in line and ".warn" in line for line in held)
    assert left_patched() == []
