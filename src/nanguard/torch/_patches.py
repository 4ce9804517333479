"""Class-level patches, installed while a guard is active and removed with the last one.

* Step recording pauses where ops are not part of the step: data loading (``DataLoader``
  iteration with ``num_workers=0`` runs the dataset's ops in this process; creating the iterator
  forks workers) and ``zero_grad``.
* LR schedulers and GradScalers created while a guard is active are registered, so a rollback
  restores their state too; ``GradScaler.step`` reports whether it skipped the optimizer step.

User objects are never touched. The wrappers are :func:`~nanguard.core.transparent.transparent`:
a warning the wrapped function raises with ``stacklevel=2`` (``GradScaler`` on a machine without
CUDA, an ``IterableDataset`` whose length is wrong) names the user's line, as without nanguard.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import dataloader as _dl

from ..core import transparent as _transparent
from ..core.transparent import transparent
from ._recorder import StepRecorder

__all__ = ["register_recorder", "unregister_recorder"]

_active: list[StepRecorder] = []
_saved: list[tuple[Any, str, Callable[..., Any]]] = []


def _paused(fn: Callable[..., Any], pop: bool = True, loads: bool = False,
            starts: bool = False) -> Callable[..., Any]:
    """Nothing inside ``fn`` is recorded. ``pop``: the tape's mode is popped too (data loading
    may run many ops; an optimizer's ``zero_grad``, whose own ``record_function`` would pass
    through the mode twice at ~9 µs each, where a pop and a push cost ~3 µs); else they only
    pass through it (a module's ``zero_grad``, with no op when it sets the gradients to None).
    ``loads``: ``fn`` hands out a batch (the recorder notes that the step loaded data).
    ``starts``: ``fn`` is a ``DataLoader`` iterator's ``__init__`` (the guards look at its data)."""
    @functools.wraps(fn)
    @transparent
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        recs = list(_active)
        for r in recs:
            r.paused += 1
            r.loaded_batch = r.loaded_batch or loads
            if pop:
                r.tape_off()
        try:
            out = fn(*args, **kwargs)
            if starts and len(args) > 1:
                for g in list(_guards):
                    g.loader_started(args[1])
            return out
        finally:
            for r in recs:
                r.paused -= 1
                if pop and not r.paused and not r.modules.depth and r.resume_tape:
                    r.tape_on()

    return wrapper


_TARGETS: list[tuple[Any, str, bool, bool, bool]] = [  # owner, name, pop, loads, starts
    (_dl._BaseDataLoaderIter, "__next__", True, True, False),
    (_dl._BaseDataLoaderIter, "__init__", True, False, True),
    (torch.optim.Optimizer, "zero_grad", True, False, False),
    (torch.nn.Module, "zero_grad", False, False, False),
]


def register_recorder(rec: StepRecorder) -> None:
    if not _active:
        _transparent.install()
        for owner, name, pop, loads, starts in _TARGETS:
            orig = owner.__dict__[name]
            _saved.append((owner, name, orig))
            setattr(owner, name, _paused(orig, pop, loads, starts))
    _active.append(rec)


def unregister_recorder(rec: StepRecorder) -> None:
    if rec in _active:
        _active.remove(rec)
    if not _active:
        while _saved:
            owner, name, orig = _saved.pop()
            setattr(owner, name, orig)
        _transparent.uninstall()


# --- schedulers, scalers ------------------------------------------------------------------------

_guards: list[Any] = []
_saved_g: list[tuple[Any, str, Callable[..., Any]]] = []


def _sched_init(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    @transparent
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig(self, *args, **kwargs)
        from .snapshot import SCHEDULERS

        SCHEDULERS.add(self)

    return __init__


def _scaler_init(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    @transparent
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig(self, *args, **kwargs)
        from .snapshot import SCALERS

        SCALERS.add(self)

    return __init__


def _scaler_scale(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def scale(self: Any, outputs: Any) -> Any:
        # a scaler made before the guard is known from the first loss it scales: before the
        # backward whose overflowing (scaled) gradients it will skip itself
        from .snapshot import SCALERS

        SCALERS.add(self)
        for g in list(_guards):
            g.loss_scaled(outputs)  # the unscaled loss: is it finite itself?
        return orig(self, outputs)

    return scale


def _scaler_step(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    @transparent
    def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        before = _steps_seen.get(id(optimizer), 0)
        out = orig(self, optimizer, *args, **kwargs)
        stepped = _steps_seen.get(id(optimizer), 0) != before
        for g in list(_guards):
            g.scaler_step(self, optimizer, stepped)
        return out

    return step


_steps_seen: dict[int, int] = {}


def _clip(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    @transparent
    def clip_grad_norm_(parameters: Any, max_norm: float, *args: Any, **kwargs: Any) -> Any:
        out = orig(parameters, max_norm, *args, **kwargs)
        for g in list(_guards):
            g.clip_called(out, max_norm)
        return out

    return clip_grad_norm_


def _count_step(opt: Any, args: Any, kwargs: Any) -> None:
    _steps_seen[id(opt)] = _steps_seen.get(id(opt), 0) + 1


_count_handle: Any = None


def register_guard(guard: Any) -> None:
    global _count_handle
    if not _guards:
        _transparent.install()
        from torch.amp import grad_scaler
        from torch.optim import lr_scheduler
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        targets = [
            (lr_scheduler.LRScheduler, "__init__", _sched_init),
            (grad_scaler.GradScaler, "__init__", _scaler_init),
            (grad_scaler.GradScaler, "step", _scaler_step),
            (grad_scaler.GradScaler, "scale", _scaler_scale),
        ]
        import torch.nn.utils as nn_utils
        from torch.nn.utils import clip_grad as clip_mod

        for owner, name, wrap in targets:
            orig = owner.__dict__[name]
            _saved_g.append((owner, name, orig))
            setattr(owner, name, wrap(orig))
        # torch.nn.utils.clip_grad_norm_ returns the only trace of an overflowing gradient norm
        orig_clip = clip_mod.clip_grad_norm_
        wrapped = _clip(orig_clip)
        for mod in (nn_utils, clip_mod):
            _saved_g.append((mod, "clip_grad_norm_", mod.clip_grad_norm_))
            mod.clip_grad_norm_ = wrapped  # type: ignore[attr-defined]
        _count_handle = register_optimizer_step_pre_hook(_count_step)
    _guards.append(guard)


def unregister_guard(guard: Any) -> None:
    global _count_handle
    if guard in _guards:
        _guards.remove(guard)
    if not _guards:
        while _saved_g:
            owner, name, orig = _saved_g.pop()
            setattr(owner, name, orig)
        if _count_handle is not None:
            _count_handle.remove()
            _count_handle = None
        _transparent.uninstall()
