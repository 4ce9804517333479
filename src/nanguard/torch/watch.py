"""The watch tier: one fused finiteness check per step, and the step's scalars.

Runs at the optimizer's pre-step hook (after backward, before the update is applied). One
``torch._foreach_norm`` over every gradient — and, with the default ``raise`` policy, on the
steps ``_watched.weights_wanted`` names, every weight as the previous update left it — then one
``torch.stack`` with the loss(es), and a single
``tolist()``: one host synchronisation per step, a handful of kernel launches whatever the number
of tensors, and the loss, the gradient norm, the weight norm and the per-tensor norms come along
for the history. Only when a number is not finite does a second, exact pass find which tensor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ._sharded import Shards, is_dtensor, local
from ._stats import checkable
from ._untraced import untraced

__all__ = ["NormCheck", "check", "check_grads", "check_params"]

_LOW = (torch.float16, torch.bfloat16)


@dataclass
class NormCheck:
    """Result of one fused check of one group of tensors (gradients, or weights).

    ``bad`` lists indices (into the caller's list) of tensors holding NaN/Inf; ``index`` maps
    each entry of ``per_tensor`` to the caller's list.
    """

    finite: bool
    norm: float | None
    per_tensor: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    bad: list[int] = field(default_factory=list)
    index: list[int] = field(default_factory=list)


def _norms(ts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Per-tensor 2-norms, each a 0-dim tensor on the first tensor's device, all of one dtype.

    float32 accumulation for float16/bfloat16 (they would overflow at 65504); a norm that
    overflows float32 on finite values is caught by the exact pass, never reported a failure.
    """
    dev, dt = ts[0].device, ts[0].dtype
    if all(t.device == dev and t.dtype == dt for t in ts):
        if dt in _LOW:
            return list(torch._foreach_norm(list(ts), 2, dtype=torch.float32))
        return list(torch._foreach_norm(list(ts)))
    out: list[torch.Tensor | None] = [None] * len(ts)
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(ts):
        groups.setdefault((t.device, t.dtype), []).append(i)
    for (_dev, gdt), idx in groups.items():
        acc = torch.float32 if gdt in _LOW else None
        for i, n in zip(idx, torch._foreach_norm([ts[i] for i in idx], 2, dtype=acc)):
            out[i] = n.to(dev, torch.float32)
    return [n for n in out if n is not None]


def _checkable(ts: Sequence[torch.Tensor | None], shard: bool = False
               ) -> tuple[list[int], list[torch.Tensor], Shards | None]:
    """Indices and tensors of ``ts`` the check reads (:func:`~._stats.checkable`), in one loop.
    A ``DTensor`` (FSDP2) is read on its local shard; with ``shard`` its position is noted for
    the sum across the mesh (:class:`Shards`, made only when there is one) — every rank then
    lists it, an empty shard too (each rank must make the same collective)."""
    idx: list[int] = []
    out: list[torch.Tensor] = []
    shards: Shards | None = None
    for i, t in enumerate(ts):
        if t is None:
            continue
        if checkable(t):
            idx.append(i)
            out.append(t)
        elif is_dtensor(t):
            loc = local(t)
            if shard and loc.is_floating_point():
                shards = shards if shards is not None else Shards()
                shards.add(len(out), t)
            elif not checkable(loc):
                continue
            idx.append(i)
            out.append(loc)
    return idx, out, shards


@untraced  # under --trace: the check's own norms are not the user's values
def check(
    grads: Sequence[torch.Tensor | None],
    losses: Sequence[torch.Tensor] = (),
    params: Sequence[torch.Tensor] = (),
) -> tuple[NormCheck, NormCheck | None]:
    """Check gradients + losses, and optionally weights, with one host synchronisation.

    Returns ``(gradient check, weight check or None)``. Runs at every step (the pre-step hook),
    so it is written for the common case: a handful of Python calls besides the norms.
    """
    # the gradients' shards are summed across the mesh (the same list on every rank); the
    # weights', read on a cadence each rank keeps, stay local norms: no collective may differ
    gi, gts, shards = _checkable(grads, shard=True)
    pi, pts, _ = _checkable(params) if params else ([], [], None)
    ls = [x for x in losses if checkable(x)]
    tensors = gts + pts if pts else gts
    if not tensors and not ls:
        return NormCheck(True, None), (NormCheck(True, None) if params else None)
    # the weights require grad: their norms must not build a graph (the switch itself, not
    # ``torch.no_grad()``'s context manager: this runs every step)
    grad_was = torch.is_grad_enabled()
    torch._C._set_grad_enabled(False)
    try:
        dev = tensors[0].device if tensors else ls[0].device
        parts: list[torch.Tensor] = _norms(tensors) if tensors else []
        if shards is not None:
            shards.reduce(parts)  # the shards' norms summed across the mesh: the global ones
        for x in ls:
            v = x.detach()
            if v.dim():
                v = v.reshape(()) if v.numel() == 1 else v.sum()
            parts.append(v if v.device == dev else v.to(dev))
        dt = parts[0].dtype
        # the norms share one dtype (``_norms``): only a loss may differ
        if any(p.dtype != dt for p in parts[len(tensors):]):
            parts = [p.to(torch.float32) for p in parts]
        vals = torch.stack(parts).tolist()  # the one host synchronisation of the step
    finally:
        torch._C._set_grad_enabled(grad_was)
    ng, npar = len(gts), len(pts)
    gper, pper, lvals = vals[:ng], vals[ng : ng + npar], vals[ng + npar :]
    exact = shards.exact(gper, gts) if shards is not None and not all(map(math.isfinite, gper)) else []
    gchk = _finish(gper, gi, gts, lvals, ls, exact)
    pchk = _finish(pper, pi, pts, [], []) if params else None
    return gchk, pchk


def _finish(
    per: list[float],
    index: list[int],
    ts: Sequence[torch.Tensor],
    lvals: list[float],
    ls: Sequence[torch.Tensor],
    exact: Sequence[int] = (),
) -> NormCheck:
    # a sum of finite norms is finite unless it overflows: then the exact test below decides
    finite = math.isfinite(sum(per) + sum(lvals)) or (
        all(math.isfinite(v) for v in per) and all(math.isfinite(v) for v in lvals))
    bad: list[int] = []
    if not finite:
        # a number is not finite: find out exactly which tensors are. A per-tensor norm that
        # overflowed float32 on finite values is no failure: its true size (in float64) goes to
        # the history, where a gradient norm of 1e21 is evidence the diagnosis needs
        for j, t in enumerate(ts):
            if math.isfinite(per[j]):
                continue
            if bool(torch.isfinite(t).all()):
                if j in exact:
                    continue  # a shard of a non-finite global norm: another rank's values
                per[j] = float(torch.linalg.vector_norm(t.detach(), dtype=torch.float64))
            else:
                bad.append(index[j])
        bad_loss = [i for i, v in enumerate(lvals) if not math.isfinite(v)
                    and not bool(torch.isfinite(ls[i]).all())]
        finite = not bad and not bad_loss
    sq = math.fsum(v * v for v in per) if per else 0.0
    norm = math.sqrt(sq) if per and math.isfinite(sq) else (float("inf") if per else None)
    return NormCheck(finite, norm, per, lvals, bad, index)


def check_grads(params: Sequence[torch.Tensor], losses: Sequence[torch.Tensor] = ()) -> NormCheck:
    """Are the gradients of ``params`` (and the ``losses``) finite? One host sync."""
    return check([p.grad for p in params], losses)[0]


def check_params(params: Sequence[torch.Tensor]) -> NormCheck:
    """Are ``params`` finite (after an update)? One host sync."""
    pchk = check([], (), params)[1]
    assert pchk is not None
    return pchk
