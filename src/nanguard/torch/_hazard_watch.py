"""Latent hazards seen by the watch: ``nanguard check``'s look, on two early steps of the run.

The check's :class:`~nanguard.torch.hazards.HazardMode` is pushed when step 0 ends and popped
when step 1's gradients are checked (at ``optimizer.step()``, or after a closure ran); again for
step 2. Those two steps cost what a trace costs (a Python call per op, a reduction per unsafe
op); every other step costs nothing. A sampled step's look pauses (its mode popped) from the
second ``no_grad`` model call on — an evaluation loop run between two steps, a rollout — until a
forward builds a graph again: minGPT's ``adder.py`` evaluates the whole dataset right after
step 0, ~170 000 ops that the look traced before (``docs/design.md``). Then the book is read once: an unsafe op on the path to the
loss that is risky **by its margin** (a ``log`` or divisor input within 1e-6 of 0 or subnormal,
an ``exp`` fewer than 10 e-folds from overflow) or **by a pattern whose singular point is part of
its domain** (``log`` of a softmax or a sigmoid, ``log(exp(x) + 1)``, ``sqrt`` of a sum of
squares, a division by a norm or a standard deviation, an ``acos`` not clamped inside ±1), or a
recurrence whose gradient overflows within a chain of 512 calls at the rate it grows, is an
early warning of kind ``latent-hazard``. Patterns that are
risky only near an edge (a division by a count, risky once the count is 1) and float16 headroom
(the loss and gradient rules of :mod:`nanguard.core.early` watch it every step) are left to
``nanguard check``, which lists everything.

After those two, the look comes back on the multiples of 25, 50, 100 or 200 steps until the
run's first non-finite value — as often as :data:`BUDGET` of the run's time allows, measured:
the extra time of the last sampled step over the plain steps', rounded up to that ladder (a
small MLP, whose traced step costs ~3 plain ones, every 200 steps; a model whose ops are large,
every 25) — so that
each unsafe op's margin is known over the run: a margin falling toward
its edge on a straight or geometric line that holds over the newest samples (a learned variance
walked below 0 under ``sqrt`` over 160 steps, a float16 result growing ×k a step) is a warning
of kind ``margin-shrinking`` with the step it reaches the edge
(:func:`~nanguard.core.hazards.trend_warning`); one that comes within reach at a later sample
warns as at step 2. Between the looks, a parameter an unsafe op reads as it is (``sqrt(self.var)``,
``x / self.temperature``, ``exp(self.log_scale)``; up to :data:`FOLLOW_MAX`) is followed at every
step — one reduction each, one host read for all, nothing on a model without one — and its
margin's line warns as ``margin-shrinking`` once it reaches the edge within
:data:`FOLLOW_HORIZON` steps (a looser horizon cannot tell a walk to 0 from one that stops at an
optimum close to it); the raw-parameter pattern of the look is then the first two steps' only.

Not sampled: the deferred watch (a GPU run that must not synchronise; the check reads margins
on the host), and steps where another dispatch mode is active (a trace, the user's own).
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode
from torch.utils.weak import WeakIdKeyDictionary

from ..core.controller import StepController
from ..core.hazards import TREND_HORIZON, HazardBook, Key, early_warning, trend_warning
from ._modules import ModuleStack
from ._recurrence import Gain
from .hazards import HazardMode, raw_margins

__all__ = ["BUDGET", "FOLLOW_HORIZON", "FOLLOW_MAX", "LATE_EVERY", "LATE_MAX", "SAMPLED_STEPS", "HazardLook"]

SAMPLED_STEPS = (1, 2)  # the steps whose unsafe ops are looked at (step 0 may be a warm-up)
#: then a step every this many steps at least ...
LATE_EVERY = 25
#: ... and at most (whatever the look costs)
LATE_MAX = 200
#: the share of the run's time the later looks may take (a sampled step runs at trace cost)
BUDGET = 0.02
#: a parameter an unsafe op reads as it is is followed at every step between the looks (one
#: reduction each, one host read for all), and warned about only when its margin's line reaches
#: the edge within this many steps: a learned variance walked down by Adam at a steady pace looks
#: the same as one that will stop at its optimum, until it stops — only a crossing this close
#: is no guess
FOLLOW_HORIZON = 6
#: parameters followed at most
FOLLOW_MAX = 8


class HazardLook:
    """The guard's two sampled steps (an observer the hooks tell when a step starts and ends)."""

    def __init__(self, controller: StepController, modules: ModuleStack) -> None:
        self.controller = controller
        self.modules = modules
        self._mode: HazardMode | None = None
        self._book: HazardBook | None = None
        self._done = False
        self._paused = False  # the mode popped while the step's forwards build no graph
        self._params: WeakIdKeyDictionary | None = None
        #: parameters read as they are by an unsafe op, found by the looks (``HazardMode.raw``)
        self._raw: WeakIdKeyDictionary | None = None
        #: module path -> (growth per call, calls to overflow) of each recurrence seen growing
        self.recurrences: dict[str, tuple[float, float]] | None = None
        self._clock = _StepClock()
        self._last = 0  # the newest sampled step

    @property
    def looking(self) -> bool:
        """A sampled step's look is on now (its mode pushed, or paused in an evaluation loop)."""
        return self._mode is not None

    @property
    def done(self) -> bool:
        """Both sampled steps were looked at (or the look cannot run: deferred, another mode)."""
        return self._done

    @property
    def paused(self) -> bool:
        return self._paused

    def sample_start(self, step: int, deferred: bool | None) -> None:
        """When a step ended (``step``: the next one's index): start looking if it is one of
        :data:`SAMPLED_STEPS` or a multiple of :data:`LATE_EVERY`, until the run met its first
        non-finite value. Never on the deferred watch."""
        self._clock.tick(sampled=self._last == step - 1 and step - 1 > 0)
        if self._raw and self._mode is None and not self._done and not deferred:
            self._follow(step)
        if self._done or self._mode is not None or not (
                step in SAMPLED_STEPS or (step > SAMPLED_STEPS[-1] and step % self._clock.every() == 0)):
            return
        if deferred or _get_current_dispatch_mode() is not None or self.controller.early.closed:
            self._done = True
            return
        if self._book is None:
            self._book, self._params, self._raw = HazardBook(), WeakIdKeyDictionary(), WeakIdKeyDictionary()
        self._book.at = self._last = step
        # the recurrence rule was measured on initial weights (benchmarks/recurrence_gain.py): a
        # trained weight-shared block applied 12 times grows ×1.3 per call, and no chain of it
        # is ever longer than 12 — only the first two steps link a module's calls
        mode = HazardMode(self._book, self.modules, self._params, recurrences=step in SAMPLED_STEPS,
                          raw=self._raw, moving=step in SAMPLED_STEPS)
        mode.__enter__()
        self._mode = mode

    def sample_end(self, step: int) -> None:
        """When the sampled step's gradients are checked (its forward and backward are done),
        or the step was abandoned: stop looking; after the last sampled step, warn."""
        mode = self._mode
        if mode is None:
            return
        self._mode = None
        if self._paused:  # popped already (``quiet``)
            self._paused = False
        elif _get_current_dispatch_mode() is mode:
            mode.__exit__(None, None, None)
        else:  # another mode was pushed above it: it stays, passing every op through
            mode.retire()
            self._done = True
        self._keep_recurrences(mode.step_done())
        book = self._book
        assert book is not None
        book.steps += 1
        if step >= SAMPLED_STEPS[-1] or self._done:
            self._warn(book, step)

    def _follow(self, step: int) -> None:
        """Between the looks, when a step ends (``step``: the next one, whose forward reads the
        parameters as they are now): the margin of each unsafe op on a parameter read as it is,
        into the book at ``step``; a line reaching its edge within :data:`FOLLOW_HORIZON` steps
        is a ``margin-shrinking`` warning."""
        book, raw = self._book, self._raw
        if book is None or raw is None or self.controller.early.closed:
            return
        reads: list[tuple[torch.Tensor, str]] = []
        obs: list[tuple[Key, dict[str, Any]]] = []
        for p, entries in list(raw.items())[:FOLLOW_MAX]:
            for key, (how, kw) in entries.items():
                reads.append((p, how))
                obs.append((key, kw))
        try:
            margins = raw_margins(reads)
        except RuntimeError:  # a parameter that cannot be reduced here: stop following, say nothing
            self._raw = None
            return
        for (_key, kw), m in zip(obs, margins):
            if math.isfinite(m):
                book.observe(**{**kw, "margin": m, "step": step})
        for key, _kw in obs:
            w = trend_warning(book.hazards[key], step, FOLLOW_HORIZON) if key in book.hazards else None
            if w is not None:
                self.controller.early.add(w)

    def _keep_recurrences(self, gains: list[Gain]) -> None:
        """The fastest growth seen per recurrent module, for the diagnosis (``RunContext``)."""
        known = self.recurrences if self.recurrences is not None else {}
        for g in gains:
            if math.isfinite(g.overflow_at) and g.rate > known.get(g.module, (1.0, math.inf))[0]:
                known[g.module] = (g.rate, g.overflow_at)
        self.recurrences = known or None

    def _warn(self, book: HazardBook, step: int) -> None:
        """One warning (the riskiest hazard), the next few named in its evidence."""
        found = [w for w in (early_warning(h, step, book.steps) for h in book.ranked()) if w is not None]
        if found:
            found[0].evidence += [f"also: {w.message}" for w in found[1:4]]
            self.controller.early.add(found[0])
        followed = {k for entries in (self._raw or {}).values() for k in entries}
        trends = sorted((w for w in (trend_warning(h, step, FOLLOW_HORIZON if k in followed else TREND_HORIZON)
                                     for k, h in book.hazards.items()) if w is not None),
                        key=lambda w: w.projected_step or 0)
        if trends:
            self.controller.early.add(trends[0])

    def quiet(self, quiet: bool) -> None:
        """The recorder's ``on_quiet``: a sampled step's forwards stopped building a graph (an
        evaluation loop or a rollout between two training steps: thousands of ops that are not
        the training step's, each at trace cost) — the look pauses, its mode popped; it goes on
        when a forward builds a graph again (the training forward it is there for)."""
        mode = self._mode
        if mode is None:
            return
        if quiet and not self._paused and _get_current_dispatch_mode() is mode:
            mode.__exit__(None, None, None)
            self._paused = True
        elif not quiet and self._paused:
            self._paused = False
            mode.__enter__()

    def release(self, step: int) -> None:
        """The guard detaches: a mode still pushed is popped (or left passing through)."""
        if self._mode is not None:
            self._done = True
            self.sample_end(step)


class _StepClock:
    """How long a plain step takes and how much longer a sampled one did: the later looks'
    spacing (``every``). Ticked at every step boundary."""

    def __init__(self) -> None:
        self._t: float | None = None
        self._plain: float | None = None  # moving average of the unsampled steps' durations
        self._sampled: float | None = None  # the newest sampled step's duration

    def tick(self, sampled: bool) -> None:
        """A step ended (``sampled``: it was looked at)."""
        now = time.perf_counter()
        if self._t is not None:
            d = now - self._t
            if sampled:
                self._sampled = d
            else:
                self._plain = d if self._plain is None else 0.8 * self._plain + 0.2 * d
        self._t = now

    def every(self) -> int:
        """Steps between two later looks: their extra time within :data:`BUDGET` of the run's,
        rounded up to :data:`LATE_EVERY` times a power of two (25, 50, 100, 200), the looks at
        its multiples — the same steps from run to run, whatever the machine's load."""
        if self._plain is None or self._sampled is None or self._plain <= 0:
            return LATE_EVERY
        need = max(self._sampled - self._plain, 0.0) / (BUDGET * self._plain)
        every = LATE_EVERY
        while every < need and every < LATE_MAX:
            every *= 2
        return every
