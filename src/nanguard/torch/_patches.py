"""Class-level patches, installed while a guard is active and removed with the last one.

* Step recording pauses where ops are not part of the step: data loading (``DataLoader``
  iteration with ``num_workers=0`` runs the dataset's ops in this process; creating the iterator
  forks workers) and ``zero_grad``; the profiler op at each end of a ``record_function`` region
  (``optimizer.step()`` opens one) does not pass through the tape's mode.
* LR schedulers and GradScalers created while a guard is active are registered, so a rollback
  restores their state too; ``GradScaler.step`` reports whether it skipped the optimizer step.

User objects are never touched. The wrappers are :func:`~nanguard.core.transparent.transparent`:
a warning the wrapped function raises with ``stacklevel=2`` (``GradScaler`` on a machine without
CUDA, an ``IterableDataset`` whose length is wrong) names the user's line, as without nanguard.
"""

from __future__ import annotations

import functools
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as _F
from torch.utils.data import dataloader as _dl

from ..core import transparent as _transparent
from ..core.patches import PatchSet
from ..core.transparent import transparent
from . import _batches
from ._light_mode import watching
from ._modules import _compiling
from ._recorder import StepRecorder

__all__ = ["register_recorder", "unregister_recorder"]

_active: list[StepRecorder] = []
#: the recorder's patches (data loading, zero_grad, the functional losses, record_function)
_RECORDING = PatchSet("the step recorder")


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
            if loads and args:
                _batches.handed_out(args[0], out)
            if starts and len(args) > 1:
                for g in list(_guards):
                    g.loader_started(args[1])
            return out
        finally:
            for r in recs:
                r.paused -= 1
            if pop:
                _push_again(recs)

    return wrapper


#: the name ``optimizer.step()``'s own ``record_function`` opens, before its step hooks run
_STEP_PROFILE = "Optimizer.step#"


def _profile_enter(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``record_function.__enter__`` runs one profiler op, which would pass through the tape's
    mode (~16 µs at each end of every ``optimizer.step()``, where a pop and a push cost ~3 µs):
    the tape is popped around it. An optimizer step's region opens just before the pre-step hook,
    which would pop the tape anyway: it stays popped (the region's exit puts it back)."""
    @functools.wraps(fn)
    def __enter__(self: Any) -> Any:
        on = [r for r in _active if r.tape_is_on]
        if not on:  # the tape is off already (zero_grad and DataLoader pop it themselves)
            return fn(self)
        for r in on:
            r.tape_off()
        try:
            return fn(self)
        finally:
            if str(getattr(self, "name", "")).startswith(_STEP_PROFILE):
                self._nanguard_popped = on  # pushed again when the region closes
                for r in on:
                    r.held_by_region = True  # the post-step hook leaves the push to the exit
            else:
                _push_again(on)

    return __enter__


def _profile_exit(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def __exit__(self: Any, *exc: Any) -> Any:
        on = [r for r in _active if r.tape_is_on]
        popped = self.__dict__.pop("_nanguard_popped", None)
        for r in popped or ():
            r.held_by_region = False
        if not on and not popped:
            return fn(self, *exc)
        for r in on:
            r.tape_off()
        try:
            return fn(self, *exc)
        finally:
            _push_again(on + [r for r in popped or () if r not in on and exc[0] is None])

    return __exit__


#: ``torch.nn.functional``'s losses (and the distance helpers losses are built from), recorded
#: as one tape event each instead of the two to five aten ops each runs: every op that passes
#: through the tape's mode costs a trip into Python (~10-20 µs on a CPU) besides itself. All are
#: deterministic and write none of their arguments; a replay re-runs the function under the
#: locator, which sees the ops inside it with the user's line as their source.
FUNCTIONAL = (
    "cross_entropy", "nll_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits", "mse_loss",
    "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div", "poisson_nll_loss", "gaussian_nll_loss",
    "soft_margin_loss", "multilabel_soft_margin_loss", "multilabel_margin_loss", "multi_margin_loss",
    "cosine_embedding_loss", "margin_ranking_loss", "hinge_embedding_loss", "triplet_margin_loss",
    "ctc_loss", "normalize", "cosine_similarity", "pairwise_distance",
)


def _functional(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A ``torch.nn.functional`` function called while exactly one recorder's tape is on (outside
    any module, not paused) is one tape event: its ops run with the tape popped. Anywhere else
    (inside a module, under ``torch.compile``, no guard attached) it runs as it is."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        rec = _sole_recorder()
        if rec is None:
            return fn(*args, **kwargs)
        return _as_one_event(rec, fn, args, kwargs)

    # TorchScript compiles the function itself, with its own globals (``torch.jit.script`` of a
    # module that calls it, such as ``nn.MSELoss``): the marks of ``torch.jit._script_if_tracing``
    setattr(wrapper, "__original_fn", fn)
    setattr(wrapper, "__script_if_tracing_wrapper", True)
    return wrapper


def _sole_recorder() -> StepRecorder | None:
    """The one recorder whose tape is on now, outside any module and not paused; ``None``
    under ``torch.compile`` (first: what dynamo traces of a wrapper is the function alone),
    with no guard attached, or with several."""
    if _compiling():
        return None
    on = [r for r in _active if r.tape_is_on] if _active else None
    if not on or len(on) > 1:
        return None
    rec = on[0]
    if rec.paused or rec.modules.depth or rec.truncated:
        return None
    return rec


def _as_one_event(rec: StepRecorder, fn: Callable[..., Any], args: Any, kwargs: Any,
                  run: Callable[[], Any] | None = None) -> Any:
    """Run ``fn(*args, **kwargs)`` — or ``run()``, recorded as that call — as one event of
    ``rec``'s tape, with the tape popped meanwhile (a mode pushed above it: its ops are taped
    one by one instead)."""
    rec.tape_off()
    if rec.tape_is_on:  # another mode above ours: the ops are recorded one by one
        return run() if run is not None else fn(*args, **kwargs)
    try:
        return rec.record_call(fn, args, kwargs, run)
    finally:
        rec.tape_on()


def _inference_enter(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.inference_mode().__enter__``: the tape goes off first. Leaving inference mode
    restores the dispatch keys saved when it was entered; with the tape pushed then and popped
    inside (a model call, a full tape), the Python key would stay on with no mode on the stack,
    and torch's next op fails an internal assert. Inside, the tape stays off (``tape_on``)."""
    @functools.wraps(fn)
    def __enter__(self: Any) -> Any:
        for r in list(_active):
            r.tape_off()
        return fn(self)

    return __enter__


def _inference_exit(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.inference_mode().__exit__``: the tape comes back once inference mode is left."""
    @functools.wraps(fn)
    def __exit__(self: Any, *exc: Any) -> Any:
        out = fn(self, *exc)
        _push_again(list(_active))
        return out

    return __exit__


def _push_again(recs: list[StepRecorder]) -> None:
    for r in recs:
        if not r.paused and not r.modules.depth and r.resume_tape:
            r.tape_on()


_TARGETS: list[tuple[Any, str, bool, bool, bool]] = [  # owner, name, pop, loads, starts
    (_dl._BaseDataLoaderIter, "__next__", True, True, False),
    (_dl._BaseDataLoaderIter, "__init__", True, False, True),
    (torch.optim.Optimizer, "zero_grad", True, False, False),
    (torch.nn.Module, "zero_grad", False, False, False),
]


def _script_warns() -> None:
    """TorchScript compiles ``warnings.warn`` in a scripted function (``F.mse_loss`` warns on
    mismatched shapes) as ``aten::warn``, found by the function's identity: the thin
    ``warnings.warn`` of :mod:`~nanguard.core.transparent` is registered as the same builtin, or
    ``torch.jit.script`` of such code fails while a guard is attached. Unregistered on restore."""
    try:
        from torch.jit import _builtins
    except ImportError:  # pragma: no cover - a torch without TorchScript
        return
    register = getattr(_builtins, "_register_builtin", None)
    if register is None:
        return
    fn = _transparent.thin_warn()
    register(fn, "aten::warn")

    def unregister() -> None:
        table = getattr(_builtins, "_builtin_table", None)
        if isinstance(table, dict):
            table.pop(id(fn), None)
        ops = getattr(_builtins, "_builtin_ops", None)
        if isinstance(ops, list):
            ops[:] = [(f, op) for f, op in ops if f is not fn]

    _RECORDING.on_restore("torch.jit builtin aten::warn -> nanguard's warnings.warn", unregister)


def register_recorder(rec: StepRecorder) -> None:
    if not _active:
        _transparent.install()
        _script_warns()
        for owner, name, pop, loads, starts in _TARGETS:
            _RECORDING.patch(owner, name, _paused(owner.__dict__[name], pop, loads, starts))
        it = _dl._BaseDataLoaderIter
        _RECORDING.patch(it, "_next_index", _batches.next_index(it.__dict__["_next_index"]))
        _RECORDING.on_restore("the last batch handed out", _batches.forget)
        for name in FUNCTIONAL:
            orig = getattr(_F, name, None)
            if callable(orig):
                _RECORDING.patch(_F, name, _functional(orig))
        rf = torch.autograd.profiler.record_function
        for name, wrap in (("__enter__", _profile_enter), ("__exit__", _profile_exit)):
            _RECORDING.patch(rf, name, wrap(rf.__dict__[name]))
        im = torch.autograd.grad_mode.inference_mode
        for name, wrap in (("__enter__", _inference_enter), ("__exit__", _inference_exit)):
            _RECORDING.patch(im, name, wrap(im.__dict__[name]))
        watching(True)  # torch.compile tells the tape and the hazard look (light modes)
        _RECORDING.on_restore("light dispatch modes told of torch.compile", lambda: watching(False))
    _active.append(rec)


def unregister_recorder(rec: StepRecorder) -> None:
    if rec in _active:
        _active.remove(rec)
    if not _active:
        _RECORDING.restore()
        _transparent.uninstall()


# --- schedulers, scalers ------------------------------------------------------------------------

_guards: list[Any] = []
#: the guard's patches (schedulers, scalers, clip_grad_norm_, the optimizer step counter)
_GUARDING = PatchSet("the guard")


def _sched_init(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    @transparent
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig(self, *args, **kwargs)
        from .snapshot import SCHEDULERS

        SCHEDULERS.add(self)

    return __init__


def _scaler_scale(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def scale(self: Any, outputs: Any) -> Any:
        # a guard knows a scaler from the first loss it scales while attached: before the
        # backward whose overflowing (scaled) gradients it will skip itself (a scaler merely
        # alive in the process — another model's, a test's — is none of its business)
        for g in list(_guards):
            g.loss_scaled(self, outputs)  # the unscaled loss: is it finite itself?
        return orig(self, outputs)

    return scale


def _scaler_step(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    @transparent
    def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        before = _steps_seen.get(optimizer, 0)
        out = orig(self, optimizer, *args, **kwargs)
        stepped = _steps_seen.get(optimizer, 0) != before
        for g in list(_guards):
            g.scaler_step(self, optimizer, stepped)
        return out

    return step


#: optimizer -> its steps so far (how GradScaler.step is told to have skipped); dropped at restore
_steps_seen: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_GUARDING.cache(_steps_seen.clear)


def _clip(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``clip_grad_norm_``: the total norm it returns joins the step's check. Called on the
    tape, it is one event: ``get_total_norm`` of the gradients (what a replay re-runs, on the
    gradients its own backward made: the norm is what can overflow); its own ops — a norm per
    gradient, then every gradient scaled in place — are not taped one by one (~9 trips into
    Python and ~2 bookkeeping entries per gradient, at every step). torch < 2.6 has no
    ``get_total_norm``: the ops are taped."""
    total_norm_of = getattr(torch.nn.utils, "get_total_norm", None)

    @functools.wraps(orig)
    @transparent
    def clip_grad_norm_(parameters: Any, max_norm: float, *args: Any, **kwargs: Any) -> Any:
        rec = _sole_recorder() if total_norm_of is not None else None
        if rec is None or total_norm_of is None:
            out = orig(parameters, max_norm, *args, **kwargs)
        else:
            gen = isinstance(parameters, types.GeneratorType)
            params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
            grads = [p.grad for p in params if p.grad is not None]
            given = params if params or not gen else iter(())  # torch warns of an empty generator
            out = _as_one_event(rec, total_norm_of, (grads, *args), kwargs,
                                run=lambda: orig(given, max_norm, *args, **kwargs))
        for g in list(_guards):
            g.clip_called(out, max_norm)
        return out

    return clip_grad_norm_


def _count_step(opt: Any, args: Any, kwargs: Any) -> None:
    _steps_seen[opt] = _steps_seen.get(opt, 0) + 1


def register_guard(guard: Any) -> None:
    if not _guards:
        _transparent.install()
        from torch.amp import grad_scaler
        from torch.optim import lr_scheduler
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        targets = [
            (lr_scheduler.LRScheduler, "__init__", _sched_init),
            (grad_scaler.GradScaler, "step", _scaler_step),
            (grad_scaler.GradScaler, "scale", _scaler_scale),
        ]
        import torch.nn.utils as nn_utils
        from torch.nn.utils import clip_grad as clip_mod

        for owner, name, wrap in targets:
            _GUARDING.patch(owner, name, wrap(owner.__dict__[name]))
        # torch.nn.utils.clip_grad_norm_ returns the only trace of an overflowing gradient norm
        wrapped = _clip(clip_mod.clip_grad_norm_)
        for mod in (nn_utils, clip_mod):
            _GUARDING.patch(mod, "clip_grad_norm_", wrapped)
        handle = register_optimizer_step_pre_hook(_count_step)
        _GUARDING.on_restore("the optimizer step counter (a global step pre-hook)", handle.remove)
    _guards.append(guard)


def unregister_guard(guard: Any) -> None:
    if guard in _guards:
        _guards.remove(guard)
    if not _guards:
        _GUARDING.restore()
        _transparent.uninstall()
