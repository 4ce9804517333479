"""Class-level patches that pause step recording where ops are not part of the step.

Data loading (``DataLoader`` iteration with ``num_workers=0`` runs the dataset's ops in this
process) and ``zero_grad`` are not part of what a replay needs. The patches are installed while at
least one recorder is active and removed with the last; user objects are never touched.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import dataloader as _dl

from ._recorder import StepRecorder

__all__ = ["register_recorder", "unregister_recorder"]

_active: list[StepRecorder] = []
_saved: list[tuple[Any, str, Callable[..., Any]]] = []


def _paused(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        recs = list(_active)
        for r in recs:
            r.paused += 1
            r.tape_off()
        try:
            return fn(*args, **kwargs)
        finally:
            for r in recs:
                r.paused -= 1
                if not r.paused and not r.modules.depth and r.resume_tape:
                    r.tape_on()

    return wrapper


_TARGETS: list[tuple[Any, str]] = [
    (_dl._BaseDataLoaderIter, "__next__"),
    (torch.optim.Optimizer, "zero_grad"),
    (torch.nn.Module, "zero_grad"),
]


def register_recorder(rec: StepRecorder) -> None:
    if not _active:
        for owner, name in _TARGETS:
            orig = owner.__dict__[name]
            _saved.append((owner, name, orig))
            setattr(owner, name, _paused(orig))
    _active.append(rec)


def unregister_recorder(rec: StepRecorder) -> None:
    if rec in _active:
        _active.remove(rec)
    if not _active:
        while _saved:
            owner, name, orig = _saved.pop()
            setattr(owner, name, orig)
