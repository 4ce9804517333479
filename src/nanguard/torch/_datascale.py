"""How far the run's data is from unit scale: its first step's batch and targets, read once.

The step recorder keeps, until the first step ends, the arguments of the step's model calls and
of its regression losses (``F.mse_loss`` / ``smooth_l1_loss`` / ``huber_loss`` on the tape, or an
``nn.MSELoss``-like module): the model's first call names the batch, the loss's second argument
the targets. Tensors in the autograd graph (state the model returned, weights) are not data and
are left out. Read at the end of the first step (under the deferred GPU watch: at a failure,
when a diagnosis asks) — never on a healthy step after it. Best-effort: what cannot be read is
left out.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from ..core.case import DataScale
from ..core.early import EarlyWarning, targets_beyond
from ._stats import iter_tensors

__all__ = ["Collected", "collect", "measure", "targets_beyond_output"]

log = logging.getLogger("nanguard")

_LOSS_MODULES = {"MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss"}
#: a tensor larger than this is not read (a failure should not wait for it)
MAX_ELEMENTS = 1 << 26

#: what :func:`measure` reads: the model's inputs, the targets, the regression loss's name
Collected = tuple[list[torch.Tensor], list[torch.Tensor], "str | None"]


def _data(obj: Any) -> Iterator[torch.Tensor]:
    """The float tensors ``obj`` holds that are data (not in the autograd graph)."""
    if isinstance(obj, torch.Tensor):
        if (obj.is_floating_point() and not obj.requires_grad and obj.grad_fn is None
                and 0 < obj.numel() <= MAX_ELEMENTS and obj.device.type != "meta"):
            yield obj
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _data(v)
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _data(v)


def collect(captured: Sequence[tuple[Any, ...]] | None) -> Collected | None:
    """The tensors a scale is read from, out of the recorder's capture (no value read: no host
    synchronisation)."""
    if not captured:
        return None
    try:
        model = next((c for c in captured if c[0] == "call" and type(c[1]).__name__ not in _LOSS_MODULES
                      and any(True for _ in c[1].parameters())), None)
        if model is None:
            return None
        found = _regression(captured)
        regression, targets = (found[0], found[2]) if found is not None else (None, None)
        return list(_data((model[2], model[3]))), list(_data(targets)), regression
    except Exception:  # best-effort evidence: never an error in the user's run
        log.debug("nanguard: the data's tensors could not be found", exc_info=True)
        return None


def _absmax(ts: list[torch.Tensor]) -> float | None:
    vals = [float(t.detach().abs().amax()) for t in ts]
    return max(vals) if vals else None


def _spread(ts: list[torch.Tensor]) -> float | None:
    """The largest per-feature max |x| over the smallest non-zero one (2-D inputs: features on
    the last axis)."""
    best = None
    for t in ts:
        if t.dim() != 2 or t.shape[1] < 2:
            continue
        cols = t.detach().abs().amax(0)
        cols = cols[cols > 0]
        if cols.numel() >= 2:
            r = float(cols.max() / cols.min())
            best = r if best is None else max(best, r)
    return best


def measure(got: Collected | None) -> DataScale | None:
    """Read the scale of :func:`collect`'s tensors (one host read per tensor)."""
    if got is None:
        return None
    inputs, ys, regression = got
    try:
        with torch.no_grad():
            return DataScale(inputs_absmax=_absmax(inputs), feature_spread=_spread(inputs),
                             targets_absmax=_absmax(ys), regression=regression)
    except Exception:  # best-effort evidence: never an error in the user's run
        log.debug("nanguard: the data's scale could not be read", exc_info=True)
        return None


def _regression(captured: Sequence[tuple[Any, ...]]) -> tuple[str, Any, Any] | None:
    """The first regression loss of the capture: its name, prediction and targets."""
    for c in captured:
        if c[0] == "op" and len(c[2]) >= 2:
            return c[1], c[2][0], c[2][1]
        if c[0] == "call" and type(c[1]).__name__ in _LOSS_MODULES and len(c[2]) >= 2:
            return type(c[1]).__name__, c[2][0], c[2][1]
    return None


def _is_output(pred: Any, out: torch.Tensor) -> bool:
    """Is the loss's prediction the model's low-precision output itself (cast or reshaped, not
    rescaled: ``pred.float() * std + mean`` is not)? One comparison, at the first step's end."""
    if not isinstance(pred, torch.Tensor) or pred.numel() != out.numel() or not pred.is_floating_point():
        return False
    if not bool(out.detach().any()):
        return False  # a zero-initialised output layer equals any rescaling of itself: no telling
    return bool(torch.equal(pred.detach().reshape(out.shape).to(out.dtype), out.detach()))


def targets_beyond_output(captured: Sequence[tuple[Any, ...]] | None, step: int) -> EarlyWarning | None:
    """At the end of the first step: a regression whose loss compares a model's float16 (or
    bfloat16) output, as it is, to targets larger than that dtype's largest value — to fit them
    the output must overflow (raw salaries in dollars under ``torch.autocast``). Best-effort."""
    if not captured:
        return None
    try:
        found = _regression(captured)
        if found is None:
            return None
        loss, pred, targets = found
        for c in captured:
            if c[0] != "out" or type(c[1]).__name__ in _LOSS_MODULES:
                continue
            for out in iter_tensors(c[2]):
                if out.dtype not in (torch.float16, torch.bfloat16) or not _is_output(pred, out):
                    continue
                ys = list(_data(targets))
                top = float(torch.finfo(out.dtype).max)
                big = _absmax(ys) if ys else None
                if big is not None and big > top:
                    autocast = any(p.dtype == torch.float32 for p in c[1].parameters())
                    return targets_beyond(step, str(out.dtype).removeprefix("torch."), top, big, loss,
                                          type(c[1]).__name__, autocast)
        return None
    except Exception:  # best-effort evidence: never an error in the user's run
        log.debug("nanguard: the targets' scale could not be read", exc_info=True)
        return None

