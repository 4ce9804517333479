"""What a torch guard watches: the models, the optimizer whose step is the step marker, the
weights and optimizer state an update writes, and their names (``encoder.fc1.weight``).

Read at every step by the fused check (names are cached and recomputed only when the set of
models or the optimizer's parameter count changes).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..core.history import History
from ._modules import ModuleStack
from ._modules import unwrap as _unwrap
from ._stats import checkable

__all__ = ["ReadCadence", "WatchSet", "WeightState", "opt_params", "plain", "weights_wanted"]

HYPER = ("lr", "eps", "momentum", "weight_decay", "betas", "alpha", "nesterov", "dampening")


def opt_params(opt: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    """Every parameter of ``opt``'s groups, in order."""
    if opt is None:
        return []
    return [p for g in opt.param_groups for p in g["params"]]


def plain(v: Any) -> Any:
    """A hyper-parameter as a plain Python value (a one-element tensor ``lr`` becomes a float)."""
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        return float(v.item())
    if isinstance(v, tuple):
        return tuple(plain(x) for x in v)
    return v


#: with policy ``raise`` the weights are read (fused with the gradients' check) at the first
#: steps, every :attr:`ReadCadence.every` steps (8 to 64), and at each step whose last update may
#: have moved them by :data:`WEIGHTS_MOVE` of their norm or more
WEIGHTS_EVERY = 8
#: a tenth of the ×1.25 a step that the ``weights-growing`` warning needs; the update's size is
#: the history's estimate (``lr·|g|``; ``lr·√n`` for Adam-like updates), which an Adam step with a
#: gradient spike (≤ ~3×) or SGD's momentum (≤ 1/(1-μ) = 10× at μ = 0.9) may exceed by this
#: margin: a step skipped by this rule cannot be one of the warning's growth steps
WEIGHTS_MOVE = 0.025


def weights_wanted(history: History, step: int, every: int, read: tuple[int, float] | None) -> bool:
    """Policy ``raise``, at step ``step``'s gradient check: read the weights the last update
    left, now? On a healthy run with small updates the answer is "every ``every`` steps"
    (:class:`ReadCadence`); whenever the weights could be growing fast enough for an early
    warning or a diagnosis to need each step, every step. ``read``: the record's step and the
    weight norm of the last read (the guard keeps it: no walk back through the history)."""
    if step < 4 or step % every == 0 or not len(history):
        return True
    last = history[-1]
    if not last.finite or last.skipped or last.event is not None or last.update_norm is None:
        return True
    known = read[1] if read is not None and last.step - read[0] < every else None
    if known is None or not math.isfinite(known) or known <= 0 or not math.isfinite(last.update_norm):
        return True
    return last.update_norm >= WEIGHTS_MOVE * known


class ReadCadence:
    """How often, on quiet steps, the weights (every :attr:`every` steps) and the optimizer state
    (every ``2 · every``) join the fused check: as often as their reads cost at most
    :attr:`BUDGET` of a step on average, between :attr:`LEAST` and :attr:`MOST` steps apart.

    Fed at every synchronous check (the pre-step hook) with the time of that check; a check of
    the gradients alone costs about what a read of the weights does (the same sizes), and the
    state is twice that (Adam's two moments), so the reads of ``every`` steps cost about two
    checks. A small or memory-bound model, whose norms are a large share of its step, has them
    read every 32–64 steps; a large compute-bound one every 8. Powers of two: a step that is a
    multiple of a longer interval is one of every shorter one."""

    #: the periodic reads' share of a step (the copy kept to replay an update has 0.5 %)
    BUDGET = 0.0025
    LEAST, MOST = WEIGHTS_EVERY, 64

    def __init__(self) -> None:
        self.every = self.LEAST
        self._checks: list[float] = []  # seconds of a check that read the gradients alone
        self._n = 0

    def timed(self, seconds: float, with_weights: bool, step_time: Callable[[], float | None]) -> None:
        """A check took ``seconds``; ``step_time``: the median step time now, when known (the
        guard's :meth:`~._update_replay.UpdateReplay.step_time`), asked every 8 checks from the 16th."""
        if not with_weights:
            self._checks.append(seconds)
            del self._checks[:-16]
        self._n += 1
        if self._n % 8 == 0 and self._n >= 16 and len(self._checks) >= 4:
            step = step_time()  # medians, every 8 checks: one slow step moves nothing
            if step is not None:
                self.every = self._interval(step)

    def _interval(self, step: float) -> int:
        check = sorted(self._checks)[len(self._checks) // 2]
        if step <= 0:
            return self.MOST
        k = self.LEAST
        while k < self.MOST and 2 * check > self.BUDGET * step * k:
            k *= 2
        return k


class WeightState:
    """What a guard knows of the weights between steps: whether an update was applied yet (else
    non-finite weights came in that way), when they are due to be read again, the last read, and
    how often quiet steps read them (:class:`ReadCadence`)."""

    def __init__(self) -> None:
        #: read with the next check (once before the first update too)
        self.due = True
        self.updated = False  # has an update been applied yet
        self.last_update_step = -1
        self.ok: bool | None = None  # the last check of the weights (None: not yet)
        #: (record's step, weight norm) of the last read (``weights_wanted``)
        self.read: tuple[int, float] | None = None
        #: weights that were non-finite before any update (no breach of skip/recover's guarantee)
        self.bad_from_start: set[str] = set()
        self.cadence = ReadCadence()
        #: the optimizer whose weights' dtype was last looked at (the float16 headroom rule)
        self.dtype_of: Any = None

    def update_applied(self, step: int) -> None:
        self.updated = True
        self.last_update_step = step


class WatchSet:
    """The models and tensors one guard watches."""

    def __init__(self, model: nn.Module | None, modules: ModuleStack) -> None:
        self.model = model
        self.modules = modules
        self.state = WeightState()
        #: the optimizer whose step marks a training step (the first stepped, or the one given)
        self.primary: torch.optim.Optimizer | None = None
        #: without an optimizer: the graph leaves of the first backward()
        self.leaves: list[torch.Tensor] | None = None
        #: steps counted at backward() while no optimizer was known (they join its first step)
        self.backward_steps = 0
        self._names: dict[int, str] = {}
        self._names_key: tuple[Any, ...] | None = None
        self._names_for: tuple[int, list[int], list[str]] | None = None
        #: the weights' count and the primary optimizer it was counted for (``None``: the graph leaves)
        self._n_params: tuple[int | None, int] | None = None
        self._opt_names: dict[int, str] = {}
        #: every optimizer that stepped under the guard, in the order first seen (a GAN's two,
        #: an actor-critic's two): a snapshot holds them all
        self._optimizers: list[weakref.ref[torch.optim.Optimizer]] = []

    def roots(self) -> list[nn.Module]:
        roots: list[nn.Module] = [self.model] if self.model is not None else []
        roots += [m for m in self.modules.roots_seen if m is not self.model]
        return roots

    def param_names(self) -> dict[int, str]:
        """``id(parameter) -> name``, recomputed only when the set of models or the optimizer's
        parameter count changes (it is read at every step)."""
        nparams = sum(len(g["params"]) for g in self.primary.param_groups) if self.primary else 0
        key = (id(self.model), len(self.modules.roots_seen), nparams)
        if key != self._names_key:
            roots = self.roots()
            names: dict[int, str] = {}
            for r in roots:
                for n, p in _unwrap(r).named_parameters():
                    names.setdefault(id(p), n)
            self._names = names
            self._names_key = key
        return self._names

    def params(self) -> list[torch.Tensor]:
        """The tensors an update writes: the primary optimizer's, else the graph leaves."""
        if self.primary is not None:
            return opt_params(self.primary)
        return list(self.leaves or [])

    def add_optimizer(self, opt: torch.optim.Optimizer) -> bool:
        """An optimizer's first step under the guard; ``True`` when the run already had one
        (what a snapshot must hold has grown)."""
        if any(r() is opt for r in self._optimizers):
            return False
        self._optimizers.append(weakref.ref(opt))
        return len(self._optimizers) > 1

    def optimizers(self) -> list[torch.optim.Optimizer]:
        """Every live optimizer of the run, the primary first."""
        live = [o for r in self._optimizers if (o := r()) is not None and o is not self.primary]
        return ([self.primary] if self.primary is not None else []) + live

    def state_params(self) -> list[torch.Tensor]:
        """The tensors every optimizer of the run writes (each once), else the graph leaves:
        what a snapshot copies and a rollback restores — the actor's weights with the critic's."""
        opts = self.optimizers()
        if len(opts) <= 1:
            return self.params()
        seen: set[int] = set()
        out: list[torch.Tensor] = []
        for o in opts:
            for p in opt_params(o):
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    def weights(self, opt: torch.optim.Optimizer, with_state: bool = True
                ) -> tuple[list[torch.Tensor], list[str]]:
        """The weights and (``with_state``) the optimizer's state tensors
        (``fc.weight:exp_avg_sq``): what an update writes, and what must stay finite after it."""
        names = self.param_names()
        ts: list[torch.Tensor] = []
        ns: list[str] = []
        for p in opt_params(opt):
            name = names.get(id(p), "?")
            ts.append(p)
            ns.append(name)
            if not with_state:
                continue
            for k, v in opt.state.get(p, {}).items():
                if isinstance(v, torch.Tensor) and v.numel() > 1 and checkable(v):
                    ts.append(v)
                    ns.append(f"{name}:{k}")
        return ts, ns

    def layer_names(self, index: list[int]) -> list[str]:
        """Names for the per-tensor norms, computed once and shared by every step's record."""
        names = self.param_names()
        cached = self._names_for
        if cached is not None and cached[0] == id(names) and cached[1] == index:
            return cached[2]
        params = self.params()
        out = [names.get(id(params[i]), f"param{i}") if i < len(params) else f"param{i}" for i in index]
        self._names_for = (id(names), list(index), out)
        return out

    def num_params(self) -> int:
        """How many weights an update writes: counted again once the primary optimizer is known
        (counted before it, from the graph leaves, it stayed 0 where FSDP2 frees them after backward,
        and Adam's update was then sized as SGD's: ``lr·|g|``, 1e5× the weights)."""
        key = id(self.primary) if self.primary is not None else None
        if self._n_params is None or self._n_params[0] != key:
            self._n_params = (key, sum(p.numel() for p in self.params()))
        return self._n_params[1]

    def optimizer_name(self, opt: torch.optim.Optimizer) -> str:
        """``Adam[0]``, ``Adam[1]``: an optimizer's class and the order it first stepped in (a
        GAN steps two), for the history's ``optimizer`` field."""
        name = self._opt_names.get(id(opt))
        if name is None:
            name = f"{type(opt).__name__}[{len(self._opt_names)}]"
            self._opt_names[id(opt)] = name
        return name

    @property
    def several_optimizers(self) -> bool:
        return len(self._opt_names) > 1
