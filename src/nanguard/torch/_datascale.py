"""How far the failing step's data is from unit scale, read from its recorded events.

Runs once, at a diagnosis (never on a healthy step). The model's batch is the arguments of the
step's first model call; a batch sliced from a dataset tensor on the tape (``x[idx]``) is read
at its source, the tensor it was sliced from. A regression loss — ``F.mse_loss`` / ``l1_loss`` /
``smooth_l1_loss`` / ``huber_loss`` on the tape, or an ``nn.MSELoss``-like module — names the
loss kind and its second argument the targets. Best-effort: what cannot be read is left out.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from ..core.case import DataScale
from ._recorder import Event, Ref, RootCall, TapeOp

__all__ = ["Collected", "collect", "data_scale", "measure"]

log = logging.getLogger("nanguard")

_LOSS_OPS = {"mse_loss": "mse_loss", "l1_loss": "l1_loss", "smooth_l1_loss": "smooth_l1_loss",
             "huber_loss": "huber_loss"}
_LOSS_MODULES = {"MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss"}
#: a tensor larger than this is not read (a healthy run never pays; a failure should not wait)
MAX_ELEMENTS = 1 << 26


def _flat(obj: Any) -> Iterator[Any]:
    if isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _flat(v)
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _flat(v)
    else:
        yield obj


def _sources(obj: Any, events: Sequence[Event], depth: int = 4) -> Iterator[torch.Tensor]:
    """The float tensors ``obj`` holds, a tensor made on the tape read at the tensors it was
    made from (not through a model call: its outputs are the model's, not the data)."""
    for v in _flat(obj):
        if isinstance(v, torch.Tensor):
            if v.is_floating_point() and 0 < v.numel() <= MAX_ELEMENTS:
                yield v
        elif isinstance(v, Ref) and depth > 0 and 0 <= v.event < len(events):
            ev = events[v.event]
            if isinstance(ev, TapeOp):
                yield from _sources(ev.args, events, depth - 1)


def _op_name(ev: TapeOp) -> str:
    name = getattr(ev.func, "__name__", str(ev.func))
    return name.split(".")[0]


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


def data_scale(events: Sequence[Event]) -> DataScale | None:
    """The :class:`~nanguard.core.case.DataScale` of the step whose events these are."""
    return measure(collect(events))


#: what :func:`measure` reads: the model's inputs, the targets, the regression loss's name
Collected = tuple[list[torch.Tensor], list[torch.Tensor], "str | None"]


def collect(events: Sequence[Event]) -> Collected | None:
    """The tensors a scale is read from (no value read: no host synchronisation)."""
    try:
        return _collect(events)
    except Exception:  # best-effort evidence: never an error in the user's run
        log.debug("nanguard: the data's tensors could not be found", exc_info=True)
        return None


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


def _collect(events: Sequence[Event]) -> Collected | None:
    model = next((ev for ev in events if isinstance(ev, RootCall) and type(ev.module).__name__ not in _LOSS_MODULES
                  and any(True for _ in ev.module.parameters())), None)
    if model is None:
        return None
    inputs = list(_sources((model.args, model.kwargs), events))
    regression = targets = None
    for ev in events:
        if isinstance(ev, TapeOp) and _op_name(ev) in _LOSS_OPS and len(ev.args) >= 2:
            regression, targets = _LOSS_OPS[_op_name(ev)], ev.args[1]
            break
        if isinstance(ev, RootCall) and type(ev.module).__name__ in _LOSS_MODULES and len(ev.args) >= 2:
            regression, targets = type(ev.module).__name__, ev.args[1]
            break
    ys = list(_sources(targets, events)) if targets is not None else []
    return inputs, ys, regression
