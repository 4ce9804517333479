"""Agreement across ranks (``torch.distributed``): every rank takes the same decision.

One collective per step: a vector with one slot per rank, set to 1 by the ranks that saw a
non-finite value, summed with ``all_reduce``. Every rank learns *which* ranks failed, so all skip
or roll back the same step and none waits on a peer that stopped. Only on a failure do the ranks
exchange the finding itself (``all_gather_object``), so every rank can report it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..core.diagnosis import Diagnosis
from ..core.finding import Finding

__all__ = ["active", "agree", "gather", "rank", "share"]


def active() -> bool:
    d = torch.distributed
    return d.is_available() and d.is_initialized() and d.get_world_size() > 1


def rank() -> int:
    return torch.distributed.get_rank() if active() else 0


def gather(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (``all_gather_object``), in rank order; ``[obj]`` without ranks.
    Only after a failure that every rank agreed on: every rank calls it at the same point."""
    if not active():
        return [obj]
    out: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


def agree(local_ok: bool, params: Sequence[torch.Tensor], loss: float | None = None
          ) -> tuple[bool, list[int], float | None]:
    """``(every rank ok, ranks that were not, the mean of the ranks' losses)``: the flags and
    the losses in the one all-reduce of the step, so that every rank's history reads the same
    loss (the outcome of a recovery is then judged the same on every rank). Without a process
    group: ``(local_ok, [] or [0], None)``."""
    if not active():
        return local_ok, ([] if local_ok else [0]), None
    d = torch.distributed
    world = d.get_world_size()
    backend = d.get_backend()
    dev = torch.device("cpu")
    if backend == "nccl":
        dev = next((p.device for p in params if p.device.type == "cuda"), torch.device("cuda"))
    flags = torch.zeros(world + 2, dtype=torch.float64, device=dev)  # the flags, Σ loss, ranks with one
    if not local_ok:
        flags[d.get_rank()] = 1.0
    if loss is not None:
        flags[world], flags[world + 1] = loss, 1.0
    d.all_reduce(flags)
    vals = flags.tolist()
    bad = [i for i, v in enumerate(vals[:world]) if v > 0]
    n = vals[world + 1]
    return not bad, bad, (vals[world] / n if n == world else None)


def share(
    finding: Finding | None, diag: Diagnosis | None, bad_ranks: Sequence[int]
) -> tuple[Finding, Diagnosis]:
    """Every rank gets the same finding: the lowest rank whose replay located an origin (with
    DDP the all-reduce spreads one rank's NaN gradient to every rank, but only the rank that made
    it can replay it), else the lowest failing rank."""
    d = torch.distributed
    payload = (finding.to_dict(), diag.to_dict()) if finding is not None and diag is not None else None
    gathered: list[tuple[dict[str, Any], dict[str, Any]] | None] = [None] * d.get_world_size()
    d.all_gather_object(gathered, payload)
    # a rank whose own values were finite (they came to it through the gradient reduction) last,
    # even after a failing rank whose replay or tracer did not name the op
    def received(r: int) -> bool:
        g = gathered[r]
        return bool(g is not None and g[0].get("details", {}).get("received"))

    order = sorted(sorted(bad_ranks) or range(len(gathered)), key=received)
    # a rank whose replay or tracer named the op, or whose own weights were found non-finite
    located = [
        r for r in order
        if (g := gathered[r]) is not None and not received(r)
        and (g[0].get("detected_by") in ("replay", "trace") or g[0].get("details", {}).get("origin") == "parameter")
    ]
    for r in located + order:
        item = gathered[r]
        if item is not None:
            fd, dd = item
            f = Finding.from_dict(fd)
            f.rank = r
            if not located and len(bad_ranks) > 1:
                f.rank = None  # several ranks failed and none named the op: not known which made it
                f.details["note"] = (f"ranks {', '.join(map(str, sorted(bad_ranks)))} all had non-finite values "
                                     "and none named the op that made them: which rank made them is not known")
                return f, Diagnosis.from_dict(dd)
            if r != d.get_rank():
                f.details["seen_on_rank"] = r
                said = f.details.get("note")
                f.details["note"] = (f"found on rank {r}; rank {d.get_rank()} received it, and every rank "
                                     "takes the same decision" + (f" — {said}" if said else ""))
            return f, Diagnosis.from_dict(dd)
    raise RuntimeError("nanguard: ranks disagree on a non-finite step but none sent a finding")
