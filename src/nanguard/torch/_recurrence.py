"""The gradient through a recurrence: a module with weights fed what it made (an RNN cell fed its
hidden state), whose backward grows by a factor at every call it goes back through.

Runs beside :class:`~nanguard.torch.hazards.HazardMode` (the watch's two sampled steps, and every
step of ``nanguard check``), as a global forward hook. At each module call with grad, the inputs'
autograd history is walked a few nodes back (:data:`_WALK` at most); an input made from the
output of an earlier call of the **same module** (``h = cell(x_t, h)``, also through a mask,
a dropout or a residual add) links the two calls, and a pre-hook on the autograd node that made
that earlier output keeps the gradient the backward brings it (no tensor is held: the nodes
are, until the step's backward is done). When the step's backward is done, :meth:`RecurrenceProbe.collect`
reads, for each chain of linked calls, the gradient's norm at each call (latest first) and fits
its growth per call going back: a tanh RNN in the chaotic regime (a recurrent init too large)
grows by a third or more per call and a long enough sequence overflows the backward, while a
gated cell or a standard init shrinks it or keeps it level (``benchmarks/recurrence_gain.py``).
A module inside another linked one (a cell's own ``Linear``) is left to the outer. The fit, the chain's length and the length at which the
gradient would pass the dtype's largest value at that rate (:class:`Gain`) are what the hazard
book gets (:mod:`nanguard.core.hazards`, kind ``recurrence``).

A fused ``nn.RNN`` / ``nn.LSTM`` / ``nn.GRU`` runs its recurrence inside one module call: not
seen here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.modules import module as _module
from torch.utils._pytree import tree_leaves

from ..core.hazards import MAX
from ..core.source import user_frame
from ._modules import ModuleStack, class_name

__all__ = ["MIN_CALLS", "Gain", "RecurrenceProbe"]

#: a chain needs the gradient at this many calls at least for its growth to be fitted
MIN_CALLS = 4
#: autograd nodes walked back from a module's input looking for the module's own output
_WALK = 24
_compiling = torch.compiler.is_compiling


@dataclass(frozen=True)
class Gain:
    """The gradient's growth through one chain of calls of one module, in one step."""

    module: str  # its path in the model ("" for the model itself)
    cls: str  # its class name
    source: str | None
    source_code: str | None
    dtype: str
    calls: int  # calls whose gradient was read (the chain's length, less its last call)
    rate: float  # growth per call going back (least squares on the log of the norms)
    total: float  # the earliest call's gradient norm over the latest's
    first: float  # the gradient norm at the earliest call

    @property
    def overflow_at(self) -> float:
        """Calls in a chain at which the gradient passes the dtype's largest value at this rate
        (``inf`` when it does not grow)."""
        if self.rate <= 1.0 or self.first <= 0:
            return math.inf
        return self.calls + math.log(MAX.get(self.dtype, MAX["float32"]) / self.first) / math.log(self.rate)


class RecurrenceProbe:
    """Links the calls of a module fed its own output, and reads their gradients after backward."""

    def __init__(self, modules: ModuleStack) -> None:
        self.modules = modules
        self._made: dict[Any, tuple[int, int]] = {}  # an output's grad_fn -> (module id, call)
        self._outs: dict[tuple[int, int], list[Any]] = {}  # a call -> the nodes that made its outputs
        self._calls: dict[int, int] = {}
        self._next: dict[tuple[int, int], int] = {}  # (module id, call) -> the call it fed
        self._hooked: set[Any] = set()
        self._grads: dict[tuple[int, int], list[torch.Tensor]] = {}
        #: module id -> its path, class name, the line that called it and its code
        self._where: dict[int, tuple[str, str, str | None, str | None]] = {}
        self._handle: Any = None

    def start(self) -> None:
        if self._handle is None:
            self._handle = _module.register_module_forward_hook(self._hook, with_kwargs=True)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            # torch's handle forgets the hook, not its with_kwargs mark: a stale entry otherwise
            getattr(_module, "_global_forward_hooks_with_kwargs", {}).pop(self._handle.id, None)
            self._handle = None

    def _hook(self, mod: torch.nn.Module, args: Any, kwargs: Any, out: Any) -> None:
        """After each module call with grad: link it to the earlier call of the same module
        that made one of its inputs, and remember its outputs for the calls after it."""
        if _compiling() or not torch.is_grad_enabled() or next(mod.parameters(), None) is None:
            return  # a module without weights (an activation, a dropout reused across layers) is no cell
        mid = id(mod)
        n = self._calls.get(mid, 0)
        self._calls[mid] = n + 1
        for t in tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                prev = self._fed_by(t.grad_fn, mid)
                if prev is not None and (mid, prev) not in self._next:
                    self._link(mod, mid, prev, n)
        nodes = list({t.grad_fn: None for t in tree_leaves(out)
                      if isinstance(t, torch.Tensor) and t.grad_fn is not None})
        if nodes:
            self._outs[(mid, n)] = nodes
            for node in nodes:
                self._made[node] = (mid, n)

    def _fed_by(self, node: Any, mid: int) -> int | None:
        """The call of module ``mid`` whose output this autograd history starts from, if it is
        within :data:`_WALK` nodes (the latest such call)."""
        seen, todo, found = {node}, [node], None
        while todo and len(seen) <= _WALK:
            fn = todo.pop()
            got = self._made.get(fn)
            if got is not None and got[0] == mid:
                found = got[1] if found is None else max(found, got[1])
                continue
            for nxt, _ in getattr(fn, "next_functions", ()):
                if nxt is not None and nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return found

    def _link(self, mod: torch.nn.Module, mid: int, prev: int, n: int) -> None:
        self._next[(mid, prev)] = n
        if mid not in self._where:
            loc = user_frame(2)
            self._where[mid] = (self.modules.path_of(mod), class_name(mod), loc.short if loc else None,
                                loc.code if loc else None)
        for node in self._outs.get((mid, prev), ()):
            if node not in self._hooked:
                self._hooked.add(node)
                node.register_prehook(self._keeper((mid, prev)))

    def _keeper(self, key: tuple[int, int]) -> Callable[[tuple[Any, ...]], None]:
        def keep(grad_outputs: tuple[Any, ...]) -> None:  # in the backward: that call's output gradients
            self._grads.setdefault(key, []).extend(g for g in grad_outputs if isinstance(g, torch.Tensor))
        return keep

    def collect(self) -> list[Gain]:
        """After the step's backward: the growth of each chain of at least :data:`MIN_CALLS`
        read gradients (the longest chain of each module); then forget the step."""
        norms: dict[tuple[int, int], float] = {}
        with torch.no_grad():
            for key, gs in self._grads.items():
                if all(g.is_floating_point() for g in gs):
                    norms[key] = math.sqrt(sum(float(torch.linalg.vector_norm(g.float())) ** 2 for g in gs))
        dtypes = {k[0]: str(gs[0].dtype).replace("torch.", "") for k, gs in self._grads.items() if gs}
        starts = set(self._next) - {(m, c) for (m, _), c in self._next.items()}
        best: dict[int, list[float]] = {}
        for mid, call in sorted(starts):
            chain: list[float] = []
            key = (mid, call)
            while True:  # along the links; a call whose gradient was not read ends a segment
                if key in norms:
                    chain.append(norms[key])
                if key not in norms or key not in self._next:
                    if len(chain) > len(best.get(mid, [])):
                        best[mid] = chain
                    chain = []
                if key not in self._next:
                    break
                key = (mid, self._next[key])
        fits = [g for mid, chain in best.items()
                if (g := _fit(self._where[mid], dtypes.get(mid, "float32"), chain)) is not None]
        self.reset()
        return _outermost(fits)

    def reset(self) -> None:
        self._hooked.clear()
        self._made.clear()
        self._outs.clear()
        self._calls.clear()
        self._next.clear()
        self._grads.clear()


def _outermost(fits: list[Gain]) -> list[Gain]:
    """The recurrences that are not inside another one: a cell's own ``Linear`` or ``Conv2d``
    is fed its previous output too (through the cell), but the cell is the recurrence."""
    paths = {g.module for g in fits}
    return [g for g in fits if not any(p != g.module and (p == "" or g.module.startswith(p + "."))
                                       for p in paths)]


def _fit(where: tuple[str, str, str | None, str | None], dtype: str, chain: list[float]) -> Gain | None:
    """The growth per call going back through ``chain`` (gradient norms, earliest call first),
    from a least-squares line through their logs; ``None`` for a chain too short or not finite."""
    ys = [math.log(v) for v in chain if 0 < v < math.inf]
    if len(ys) < MIN_CALLS or len(ys) != len(chain):
        return None
    k = len(ys)
    xm, ym = (k - 1) / 2, sum(ys) / k
    slope = sum((i - xm) * (y - ym) for i, y in enumerate(ys)) / sum((i - xm) ** 2 for i in range(k))
    return Gain(*where, dtype, k, math.exp(-slope), chain[0] / chain[-1], chain[0])
