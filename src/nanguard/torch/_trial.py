"""Trying a fix on the failing step before it is applied (see :mod:`nanguard.core.trials`).

Runs only after a non-finite step whose cause has a recovery rule, under ``skip``/``recover``:
from the newest healthy snapshot, the failing step's recorded events (the model call and the
loss computation, with the RNG states they ran with) are re-run plainly — no locator — to get
the loss and the gradients on that batch; the fix is applied (learning-rate factor, clipping,
``eps``) and the real optimizer takes the update, :data:`~nanguard.core.trials.TRIAL_STEPS`
times. The guard's own hooks stand aside while it runs (``Actuator.trialing``); the run is left
at the snapshot, with the step's gradients as they were. Under torch.distributed every rank runs
every trial; on FSDP2 (collectives in every forward and backward) each turn of a trial's loop is
agreed across the ranks, so that all take the same number of turns.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from ..core.errors import internal_error
from ..core.trials import TRIAL_STEPS, Fix, Trial
from . import _autograd, _dist
from ._collectives import CollectiveInReplay
from ._recorder import Backward, Event, RootCall, TapeOp
from ._sharded import is_dtensor, local
from .replay import _run_op, _run_root, _Values

__all__ = ["run_trials"]

log = logging.getLogger("nanguard")


class _Plain:
    """What the replay's event runners need of a locator, doing nothing: a trial is plain."""

    def running(self, **_: Any) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def note(self, _: str) -> None:
        return None


def step_loss(events: Sequence[Event], params: Sequence[torch.Tensor]) -> tuple[float, list[torch.Tensor | None]]:
    """Re-run ``events`` (up to the step's last backward) on the weights as they are now: the
    step's loss (the sum of its backward roots) and the gradients of ``params``. FSDP2's
    sharded weights are reached by no ``autograd.grad`` of the re-run (their gradients come from
    its own reduce-scatter hooks): the re-run's backward is then a real one, on every rank at
    once, and the gradients are those its hooks write (averaged across the ranks)."""
    last = max((i for i, ev in enumerate(events) if isinstance(ev, Backward)), default=-1)
    if last < 0:
        raise LookupError("the step has no recorded backward")
    values, produced, loc = _Values(), set[int](), _Plain()
    sharded = any(is_dtensor(p) for p in params)
    total: list[torch.Tensor | None] = [None] * len(params)
    loss = 0.0
    for i, ev in enumerate(events[: last + 1]):
        if isinstance(ev, TapeOp):
            _run_op(ev, i, values, loc, produced)  # type: ignore[arg-type]
        elif isinstance(ev, RootCall):
            _run_root(ev, i, values, loc, produced)  # type: ignore[arg-type]
        elif isinstance(ev, Backward):
            roots = [r for r in values.resolve(ev.roots) if isinstance(r, torch.Tensor) and r.requires_grad]
            if not roots:
                continue
            loss += math.fsum(float(r.detach().double().sum()) for r in roots)
            gs = _sharded_grads(roots, params) if sharded else _grads(roots, params)
            for j, g in enumerate(gs):
                if g is not None:
                    prev = total[j]
                    total[j] = g if prev is None else prev + g
    return loss, total


def _grads(roots: list[torch.Tensor], params: Sequence[torch.Tensor]) -> list[torch.Tensor | None]:
    want = [p for p in params if p.requires_grad]
    it = iter(_autograd.original_grad()(roots, want, [torch.ones_like(r) for r in roots], allow_unused=True))
    return [next(it) if p.requires_grad else None for p in params]


def _sharded_grads(roots: list[torch.Tensor], params: Sequence[torch.Tensor]) -> list[torch.Tensor | None]:
    saved = [p.grad for p in params]
    for p in params:
        p.grad = None
    try:
        _autograd.original_backward()(roots, [torch.ones_like(r) for r in roots])
        return [p.grad for p in params]
    finally:
        for p, g in zip(params, saved):
            p.grad = g


def _all_finite(flags: list[bool], sharded: bool) -> list[bool]:
    """``flags`` as every rank agrees on them (each true only where it is on every rank): under
    FSDP2 each rank's loop must take the same turns, every turn runs collectives."""
    if not (sharded and _dist.active()):
        return flags
    import torch.distributed as dist

    t = torch.tensor([1.0 if f else 0.0 for f in flags])
    if dist.get_backend() == "nccl":
        t = t.to(torch.device("cuda", torch.cuda.current_device()))
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return [bool(v > 0) for v in t.tolist()]


@contextlib.contextmanager
def _settings(opt: torch.optim.Optimizer, fix: Fix, scale: float) -> Iterator[None]:
    """The optimizer's learning rate (× the run's back-off × the fix's factor), ``eps`` and weight decay for
    one trial update; put back after it."""
    saved = [(g.get("lr"), g.get("eps"), g.get("weight_decay")) for g in opt.param_groups]
    factor = scale * (fix.lr_factor if fix.lr_factor is not None else 1.0)
    for g in opt.param_groups:
        if isinstance(g.get("lr"), (int, float)):
            g["lr"] = g["lr"] * factor
        if fix.eps is not None and isinstance(g.get("eps"), (int, float)) and g["eps"] < fix.eps:
            g["eps"] = fix.eps
        wd = g.get("weight_decay")
        if fix.weight_decay is not None and isinstance(wd, (int, float)) and wd > fix.weight_decay:
            g["weight_decay"] = fix.weight_decay
    try:
        yield
    finally:
        for g, (lr, eps, wd) in zip(opt.param_groups, saved):
            if lr is not None:
                g["lr"] = lr
            if eps is not None:
                g["eps"] = eps
            if wd is not None:
                g["weight_decay"] = wd


def _lr_of(opt: torch.optim.Optimizer, fix: Fix, scale: float) -> float | None:
    lr = opt.param_groups[0].get("lr") if opt.param_groups else None
    if not isinstance(lr, (int, float)):
        return None
    return float(lr) * scale * (fix.lr_factor if fix.lr_factor is not None else 1.0)


def _raw_step(opt: torch.optim.Optimizer) -> None:
    """The optimizer's update without its step hooks (nobody's: not the guard's, not the
    script's own — a trial is not a step of the run) where torch's hook wrapper can be undone."""
    raw = getattr(type(opt).step, "__wrapped__", None)
    if raw is not None:
        raw(opt)
    else:
        opt.step()


def _one(events: Sequence[Event], params: list[torch.Tensor], opt: torch.optim.Optimizer, fix: Fix,
         restore: Any, lr_scale: float, clips: list[float]) -> tuple[tuple[float, ...], bool]:
    """One fix: the losses before and after each trial update, and whether the last gradients
    were finite."""
    restore()
    losses: list[float] = []
    clips = [c for c in (fix.clip_norm, *clips) if c is not None]
    sharded = any(is_dtensor(p) for p in params)
    for k in range(TRIAL_STEPS + 1):
        loss, grads = step_loss(events, params)
        if all(g is None for g in grads):
            # the weights are reached by another path than this re-run's autograd: an update
            # would change nothing, and "the loss did not go down" would be a false claim
            raise LookupError("no gradient of the re-run reached the optimizer's weights")
        losses.append(loss)
        loss_ok, grads_ok = _all_finite(
            [math.isfinite(loss), all(g is None or bool(torch.isfinite(local(g)).all()) for g in grads)], sharded)
        if k == TRIAL_STEPS or not loss_ok:
            break
        if not grads_ok:
            return tuple(losses), False
        for p, g in zip(params, grads):
            p.grad = g
        if clips:
            torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], min(clips))
        with _settings(opt, fix, lr_scale):
            _raw_step(opt)
    return tuple(losses), True


def run_trials(events: Sequence[Event], params: Sequence[torch.Tensor], opt: torch.optim.Optimizer,
               fixes: Sequence[Fix], from_step: int, restore: Any, lr_scale: float,
               clips: list[float], stop_early: bool = True) -> list[Trial] | None:
    """Try each of ``fixes`` (see the module docstring) from the snapshot of ``from_step``
    (``restore()`` puts it back); ``lr_scale`` and ``clips`` are the back-off already in force
    and the script's own clipping; ``stop_early``: stop at the first verified fix or at a step
    that fails before any update (else every fix is tried). ``None`` when the step cannot be re-run (no recorded backward,
    or an event that raised: the fix is then judged by the outcome)."""
    if not any(isinstance(ev, Backward) for ev in events):
        return None
    ps = list(params)
    saved_grads = [p.grad for p in ps]
    out: list[Trial] = []
    try:
        for fix in fixes:
            try:
                losses, grads_ok = _one(events, ps, opt, fix, restore, lr_scale, clips)
            except (LookupError, CollectiveInReplay):  # an event dropped from a long tape, or a
                # collective of the script's own (every rank meets it at the same event): not re-runnable
                log.debug("nanguard: the step cannot be re-run for a trial", exc_info=True)
                return None
            except Exception as exc:  # the fix is then judged by the outcome
                internal_error(f"the trial of {fix.describe()}", exc)
                return None
            out.append(Trial(fix, losses, from_step, lr=_lr_of(opt, fix, lr_scale), grads_finite=grads_ok))
            if stop_early and (out[-1].verified or out[-1].fails_at_start):
                break  # the least drastic fix that works is the one applied; a step that fails
                # before any update fails so whatever the fix
    finally:
        restore()
        for p, g in zip(ps, saved_grads):
            p.grad = g
    return out
