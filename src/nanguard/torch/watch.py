"""The watch tier: one fused finiteness check per step, and the step's scalars.

``check_grads`` runs at the optimizer's pre-step hook (after backward, before the update is
applied); ``check_params`` right after the step. Each computes per-tensor norms with
``torch._foreach_norm`` (one kernel launch per device and dtype on CUDA), reduces them, and brings
the handful of numbers to the host in a single ``tolist()``: one synchronisation, and the loss,
the global gradient norm and the per-tensor norms come along for the history.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ._stats import checkable

__all__ = ["NormCheck", "check_grads", "check_params"]

_LOW = (torch.float16, torch.bfloat16)


@dataclass
class NormCheck:
    """Result of one fused check. ``bad`` lists indices of tensors that hold NaN/Inf."""

    finite: bool
    norm: float | None
    per_tensor: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    bad: list[int] = field(default_factory=list)
    index: list[int] = field(default_factory=list)  # position in the caller's list of each norm


def _norms(ts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(ts):
        groups.setdefault((t.device, t.dtype), []).append(i)
    out: list[torch.Tensor | None] = [None] * len(ts)
    for (dev, dt), idx in groups.items():
        group = [ts[i] for i in idx]
        if dt in _LOW:
            norms = torch._foreach_norm(group, 2, dtype=torch.float32)
        else:
            norms = torch._foreach_norm(group, 2, dtype=torch.float64 if dev.type == "cpu" else None)
        for i, n in zip(idx, norms):
            out[i] = n
    return [n for n in out if n is not None]


def _fused(tensors: Sequence[torch.Tensor | None], extra: Sequence[torch.Tensor]) -> NormCheck:
    index = [i for i, t in enumerate(tensors) if t is not None and checkable(t)]
    ts: list[torch.Tensor] = [t for t in tensors if t is not None and checkable(t)]
    if not ts and not extra:
        return NormCheck(True, None)
    dev = ts[0].device if ts else extra[0].device
    parts: list[torch.Tensor] = []
    per = None
    if ts:
        norms = _norms(ts)
        per = torch.stack([n.to(dev, torch.float64) for n in norms])
        parts.append(torch.linalg.vector_norm(per).reshape(1))
    if extra:
        parts.append(torch.stack([e.detach().to(dev, torch.float64).sum() for e in extra]))
    if per is not None:
        parts.append(per)
    vals = torch.cat(parts).tolist()  # the one host synchronisation of the step
    k = 1 if ts else 0
    norm = vals[0] if ts else None
    losses = vals[k : k + len(extra)]
    per_l = vals[k + len(extra) :]
    finite = all(math.isfinite(v) for v in vals[: k + len(extra)])
    bad: list[int] = []
    if not finite:
        # the fused number is not finite: find out exactly which tensors are (an overflowing but
        # finite norm is not a failure)
        bad = [index[j] for j, t in enumerate(ts) if not bool(torch.isfinite(t).all())]
        bad_loss = [i for i, v in enumerate(losses) if not math.isfinite(v)]
        bad_loss = [i for i in bad_loss if not bool(torch.isfinite(extra[i]).all())]
        finite = not bad and not bad_loss
    return NormCheck(finite, norm, per_l, losses, bad, index)


def check_grads(params: Sequence[torch.Tensor], losses: Sequence[torch.Tensor] = ()) -> NormCheck:
    """Are the gradients of ``params`` (and the ``losses``) finite? One host sync."""
    return _fused([p.grad for p in params], [x for x in losses if checkable(x)])


def check_params(params: Sequence[torch.Tensor]) -> NormCheck:
    """Are ``params`` finite after the update? One host sync."""
    return _fused(list(params), [])
