"""Sharded tensors (``DTensor``: FSDP2, tensor parallelism) in the watch's check.

A ``DTensor`` is checked on its local shard (``to_local()``: never a ``full_tensor()`` gather of
the model): the shard's finiteness is this rank's, and its norm is a partial one — the squares of
the shards are summed across the mesh dimensions the tensor is sharded on, with one
``all_reduce`` per process group per check, so the norms in the history are the global ones.
A replicated ``DTensor``'s local tensor is the whole tensor: nothing to reduce.

Only runs when the watched tensors are ``DTensor`` s (a plain run pays one ``type`` test per
tensor, which the check makes anyway).
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["Shards", "is_dtensor", "local"]


#: the backends whose all-reduce takes float64
_FLOAT64_BACKENDS = frozenset({"gloo", "nccl", "mpi"})


def is_dtensor(t: object) -> bool:
    return type(t).__name__ == "DTensor" and hasattr(t, "_local_tensor")


def local(t: Any) -> torch.Tensor:
    """The shard of ``t`` this rank holds (``t`` itself for a plain tensor)."""
    return t._local_tensor if is_dtensor(t) else t


def _shard_groups(t: Any) -> tuple[Any, ...]:
    """The process groups over which ``t``'s local squares must be summed (its ``Shard`` dims)."""
    mesh = t.device_mesh
    out = []
    for dim, placement in enumerate(t.placements):
        if placement.is_shard():
            out.append(mesh.get_group(dim))
    return tuple(out)


class Shards:
    """The sharded entries of one check: which positions, reduced over which groups."""

    def __init__(self) -> None:
        self.positions: dict[tuple[Any, ...], list[int]] = {}

    def add(self, position: int, t: Any) -> None:
        groups = _shard_groups(t)
        if groups:
            self.positions.setdefault(groups, []).append(position)

    def __bool__(self) -> bool:
        return bool(self.positions)

    def reduce(self, norms: list[torch.Tensor]) -> None:
        """Turn each sharded position's local norm into the global one (in place), summing the
        squares across its groups: in float64 where the backend reduces it (gloo, NCCL, MPI) — a
        diverging run's gradient norm of 1e21 squares past float32's range, and its ranks then
        each read their own shard's norm — else in float32."""
        import torch.distributed as dist

        wide = dist.get_backend() in _FLOAT64_BACKENDS
        for groups, pos in self.positions.items():
            sq = torch.stack([norms[i].double() if wide else norms[i].float() for i in pos]).square()
            for g in groups:
                dist.all_reduce(sq, group=g)
            roots = sq.sqrt()
            for k, i in enumerate(pos):
                norms[i] = roots[k].to(norms[i].dtype)

    def exact(self, per: list[float], ts: list[torch.Tensor]) -> list[int]:
        """After :meth:`reduce`: a sharded position whose global norm came out non-finite (the
        same positions on every rank: the norm is agreed) is read again exactly — each rank's
        local squares in float64, summed across the mesh — so that a finite gradient whose norm
        overflowed float32 gets its true global size on every rank (not each rank its own
        shard's). Returns the positions read again; ``per`` is updated in place."""
        import torch.distributed as dist

        wide = dist.get_backend() in _FLOAT64_BACKENDS
        done: list[int] = []
        for groups, pos in self.positions.items():
            again = [i for i in pos if not math.isfinite(per[i])]
            if not again:
                continue
            sq = torch.stack([torch.linalg.vector_norm(ts[i].detach(), dtype=torch.float64).square()
                              for i in again])
            if not wide:
                sq = sq.float()
            for g in groups:
                dist.all_reduce(sq, group=g)
            for i, v in zip(again, sq.sqrt().tolist()):
                per[i] = v
            done.extend(again)
        return done

