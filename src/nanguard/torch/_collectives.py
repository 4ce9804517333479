"""A replay on one rank that never waits on another.

After every rank has agreed that a step failed, only the ranks whose own values were non-finite
replay it; the others go straight to the exchange of findings. A replay that issued a collective
would wait on ranks that are not replaying — FSDP2's all-gather in each module's forward and its
reduce-scatter in backward, a tensor-parallel all-reduce — and gloo aborts the job with a size
mismatch, NCCL hangs. So:

* :class:`LocalShards` — at the agreed failure (every rank, in the same order), each FSDP2 module's
  parameters are gathered (``unshard()``: one all-gather per module, what its forward does) and
  left unsharded, with its reshard and its gradient reduce-scatter switched off, so that the
  replay runs the modules' forward and backward on this rank alone; resharded and given back
  their settings once the finding is shared (or the replay is over).
* :class:`NoCollectives` — a dispatch mode under the replay that stops it *before* any
  collective (``c10d``, ``_c10d_functional``): what cannot be re-run on one rank is said, never
  waited on.

Costs nothing on a healthy step: both run only after a failure every rank agreed on.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from ._light_mode import LightMode

__all__ = ["CollectiveInReplay", "LocalShards", "NoCollectives", "fsdp_modules", "is_collective"]

_COLLECTIVE_NAMESPACES = frozenset({"c10d", "_c10d_functional", "c10d_functional"})

#: each FSDP2 parameter group's settings that the gather switches off, saved and put back as they were
_GROUP_SETTINGS = ("post_forward_mesh_info", "reduce_grads", "all_reduce_grads", "reshard_after_backward")


class CollectiveInReplay(RuntimeError):
    """The replay reached a collective: on one rank it would wait on the others forever."""

    def __init__(self, op: str) -> None:
        super().__init__(op)
        self.op = op


def is_collective(func: Any) -> bool:
    """Is ``func`` (a recorded op) a collective? One the script ran itself outside any module (an
    ``accelerator.gather`` of the loss for its log) is never run again by a replay or a trial:
    the ranks re-run their steps apart, and a rank that ran it again would pair it with another
    rank's unrelated collective."""
    return getattr(func, "namespace", "") in _COLLECTIVE_NAMESPACES


class NoCollectives(LightMode):
    """Under the replay: raises :class:`CollectiveInReplay` before a collective op runs."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if is_collective(func):
            raise CollectiveInReplay(str(func))
        return func(*args, **(kwargs or {}))


def _fsdp_class() -> type | None:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a build without torch.distributed
        return None
    return FSDPModule


def fsdp_modules(roots: Iterable[nn.Module | None]) -> list[nn.Module]:
    """The FSDP2 modules under ``roots``, each once, in registration order (the same on every rank)."""
    cls = _fsdp_class()
    if cls is None:
        return []
    out: list[nn.Module] = []
    seen: set[int] = set()
    for root in roots:
        if root is None:
            continue
        for m in root.modules():
            if isinstance(m, cls) and id(m) not in seen:
                seen.add(id(m))
                out.append(m)
    return out


def _groups(m: nn.Module) -> list[Any]:
    return list(m._get_fsdp_state()._fsdp_param_groups)  # type: ignore[operator]


def _gathered_bytes(modules: list[nn.Module]) -> int:
    """The bytes the modules' parameters take once gathered (the global sizes: the same on every rank)."""
    return sum(p.numel() * p.element_size() for m in modules for p in m.parameters(recurse=False))


def _room(modules: list[nn.Module]) -> bool:
    """Whether this rank can hold every module's gathered parameters at once (a GPU: half its free
    memory; host memory is not measured)."""
    dev = next((p.device for m in modules for p in m.parameters(recurse=False)), torch.device("cpu"))
    if dev.type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info(dev)
    return _gathered_bytes(modules) < free // 2


class LocalShards:
    """FSDP2's modules gathered for a replay on one rank (see the module docstring).

    :meth:`gather` runs on every rank at the agreed failure (collective: the same modules in the
    same order everywhere); :meth:`release` on every rank once the finding is shared (local; it
    may run twice)."""

    def __init__(self, modules: list[nn.Module]) -> None:
        self.modules = modules
        self._saved: list[tuple[Any, dict[str, Any]]] = []
        #: why the modules were not gathered (the replay then stops at their first collective)
        self.skipped: str | None = None

    @property
    def gathered(self) -> bool:
        return bool(self._saved)

    def gather(self) -> None:
        import torch.distributed as dist

        if not self.modules:
            return
        room = torch.tensor([1.0 if _room(self.modules) else 0.0])
        dev = next((p.device for p in self.modules[0].parameters()), torch.device("cpu"))
        if dist.get_backend() == "nccl":
            room = room.to(dev)
        dist.all_reduce(room, op=dist.ReduceOp.MIN)  # one answer for every rank: all gather or none
        if float(room) < 1.0:
            self.skipped = (f"the model's {_gathered_bytes(self.modules) / 2**30:.1f} GiB of parameters, "
                            "gathered, would not fit beside the run on every rank")
            return
        for m in self.modules:
            for g in _groups(m):
                self._saved.append((g, {k: getattr(g, k) for k in _GROUP_SETTINGS if hasattr(g, k)}))
            m.unshard()  # type: ignore[operator]
        for g, _ in self._saved:
            g.post_forward_mesh_info = None  # no reshard after forward
            g.reduce_grads = g.all_reduce_grads = False  # no reduce-scatter in backward
            g.reshard_after_backward = False

    def release(self) -> None:
        """Give the modules back as FSDP2 keeps them between steps: sharded, their settings restored,
        the iteration state a replay stopped mid-forward may have left reset."""
        if not self._saved:
            return
        for g, settings in self._saved:
            for k, v in settings.items():
                setattr(g, k, v)
        self._saved = []
        for m in self.modules:
            m.reshard()  # type: ignore[operator]
        for m in self.modules:
            reset = getattr(m, "reset_iter_state", None)
            if callable(reset) and m._get_fsdp_state()._is_root:  # type: ignore[operator]
                reset()
