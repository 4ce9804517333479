"""The watch without a host synchronisation on a healthy step (GPU mode).

The synchronous watch reads its fused check with one ``tolist()`` per step: on a GPU that read
waits for the whole step to finish. In this mode the check stays on the device:

* at the optimizer's pre-step hook, the same ``torch._foreach_norm`` over the gradients (and the
  weights the previous update left), stacked with the loss(es), gives a stats vector and a
  device flag ``bad`` — no read;
* the update is skipped *on the device* when ``bad`` is set: an optimizer with a fused kernel
  (``fused=True``) takes it as ``found_inf`` (as under ``GradScaler``); any other optimizer gets a
  masked update (weights and state tensors copied before the step, put back with one
  ``torch.where`` per tensor after it). State on another device than the flag (a CPU ``step``
  counter) is put back when the host reads the flag;
* the stats are copied into a host buffer (pinned, ``non_blocking``, with an event on CUDA);
* the host reads that buffer one step later, at the next pre-step hook (the event long
  completed, so nothing waits) or when the guard detaches: the history record of the step is
  filled in, and a non-finite step is replayed and diagnosed then, with its own recorded events
  — on the weights it ran with, since its update never happened.

Used with the ``raise`` policy (``skip``/``recover`` must decide before the update). Automatic
when the watched parameters are on CUDA; ``NANGUARD_WATCH_DEFERRED=1`` forces it on (how the
tests exercise it on the CPU), ``=0`` off.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..core import config
from ..core.history import StepRecord
from ._recorder import Event
from ._stats import checkable
from ._untraced import untraced

__all__ = ["InFlight", "deferred_wanted", "device_check", "masked_step"]

_LOW = (torch.float16, torch.bfloat16)


def deferred_wanted(params: Sequence[torch.Tensor], policy: str) -> bool:
    """Is the deferred (no host sync) watch wanted for these parameters?"""
    env = config.watch_deferred()
    if policy != "raise" or env == "0":
        return False
    if env == "1":
        return True
    return any(p.device.type == "cuda" for p in params)


@dataclass
class InFlight:
    """One step's device-side check, until the host reads it (one step later)."""

    step: int
    host: torch.Tensor  # the stats vector, copied to the host (pinned on CUDA)
    event: Any  # a CUDA event recorded after the copy, or None on the CPU
    n_grads: int
    n_weights: int
    gi: list[int]  # indices (into the optimizer's parameters) of the checked gradients
    pi: list[int]  # indices (into the weights) of the checked weights
    wnames: list[str]
    events: list[Event]  # the step's recorded events, for its replay
    sinks: list[Any]
    opt: torch.optim.Optimizer
    record: StepRecord | None = None
    host_state: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    n_losses: int = 0

    def values(self) -> list[float]:
        if self.event is not None:
            self.event.synchronize()  # recorded a step ago: already complete
        # a view of host memory, read through numpy: no device read, no tensor method
        return [float(v) for v in self.host.numpy()]


@untraced
@torch.no_grad()
def device_check(grads: Sequence[torch.Tensor | None], losses: Sequence[torch.Tensor],
                 weights: Sequence[torch.Tensor]) -> tuple[torch.Tensor | None, torch.Tensor | None,
                                                           list[int], list[int]]:
    """The fused check, left on the device: ``(stats, bad flag, gi, pi)`` (``None`` when there
    is nothing to check). ``stats`` holds the gradients' norms, the weights', then the losses."""
    gi = [i for i, t in enumerate(grads) if t is not None and checkable(t)]
    pi = [i for i, t in enumerate(weights) if checkable(t)]
    ts: list[torch.Tensor] = [g for g in (grads[i] for i in gi) if g is not None]
    ts += [weights[i] for i in pi]
    ls = [x for x in losses if checkable(x)]
    if not ts and not ls:
        return None, None, gi, pi
    dev = (ts[0] if ts else ls[0]).device
    parts: list[torch.Tensor] = []
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(ts):
        groups.setdefault((t.device, t.dtype), []).append(i)
    out: list[torch.Tensor | None] = [None] * len(ts)
    for (_d, dt), idx in groups.items():
        acc = torch.float32 if dt in _LOW else None
        for i, n in zip(idx, torch._foreach_norm([ts[i] for i in idx], 2, dtype=acc)):
            out[i] = n.to(dev, torch.float32)
    parts = [n for n in out if n is not None]
    for x in ls:
        v = x.detach()
        v = v.reshape(()) if v.numel() == 1 else v.sum()
        parts.append(v.to(dev, torch.float32))
    stats = torch.stack(parts)
    return stats, ~torch.isfinite(stats).all(), gi, pi


def to_host(stats: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """Start copying ``stats`` to the host; ``(host buffer, event)``."""
    if stats.device.type == "cuda":
        host = torch.empty(stats.shape, dtype=stats.dtype, pin_memory=True)
        host.copy_(stats, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record()
        return host, ev
    return stats.detach().clone(), None


class masked_step:
    """Skip ``opt``'s update on the device when ``bad`` is set: ``found_inf`` for fused
    optimizers, else weights and state put back with ``torch.where`` after the step."""

    def __init__(self, opt: torch.optim.Optimizer, bad: torch.Tensor) -> None:
        self.opt = opt
        self.bad = bad
        self.fused = any(g.get("fused") for g in opt.param_groups) and not hasattr(opt, "found_inf")
        self.saved: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.host_state: list[tuple[torch.Tensor, torch.Tensor]] = []

    @torch.no_grad()
    def before(self) -> None:
        if self.fused:
            # the fused kernels skip the update and undo their step counters themselves
            self.opt.found_inf = self.bad.to(torch.float32)  # type: ignore[attr-defined]
            return
        dev = self.bad.device
        for g in self.opt.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                self.saved.append((p, p.detach().clone()))
                for v in self.opt.state.get(p, {}).values():
                    if isinstance(v, torch.Tensor):
                        target = self.saved if v.device == dev else self.host_state
                        target.append((v, v.detach().clone()))

    @torch.no_grad()
    def after(self) -> None:
        if self.fused:
            if hasattr(self.opt, "found_inf"):
                del self.opt.found_inf
            return
        for t, old in self.saved:
            t.copy_(torch.where(self.bad, old, t))
        self.saved = []
