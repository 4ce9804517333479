"""The copy kept before a healthy update, to replay it op by op if it turns out to make the
weights non-finite (Adam with ``eps=0``: the finding then names ``aten.addcdiv_``).

Runs at the optimizer's pre-step hook of every healthy step (:meth:`UpdateReplay.keep`) — only
while the copy is affordable — and, after a failed update, once (:meth:`UpdateReplay.run`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..core.finding import Finding
from ..core.history import History
from ._modules import ModuleStack
from .locator import LocateOptions, Locator

__all__ = ["UpdateReplay"]

log = logging.getLogger("nanguard")


class UpdateReplay:
    """Keeps weights, gradients and optimizer state from before an update (bounded in size
    and in share of the step time) and replays that update under the locator on demand."""

    #: the copy is made while it costs at most this share of a step (the measured copy; its
    #: real cost, with allocation and cache traffic, is up to twice that): a quarter of the
    #: watch's whole budget of 2 %
    BUDGET = 0.005

    def __init__(self) -> None:
        self.copy: tuple[int, list[torch.Tensor], list[Any], dict[Any, Any]] | None = None
        self._copy_times: list[float] = []
        self._step_times: list[float] = []
        self._last_pre: float | None = None
        self._copy_size: tuple[tuple[int, int, int, int], int] | None = None
        self._usual_gn: tuple[int, float | None] | None = None
        self._cheap: bool | None = None  # does a copy cost under BUDGET of a step (medians)?

    def keep(self, opt: torch.optim.Optimizer, params: Sequence[torch.Tensor], step: int,
             history: History, grad_norm: float | None) -> None:
        """Before a healthy update: keep a copy of weights, gradients and state — when they are
        at most 64 MB together and copying them costs under 0.5 % of a step (until a step time is
        known: when under 16 MB), or the update is at risk. Larger models get the optimizer
        named (``Adam.step``) instead of the op."""
        now = time.perf_counter()
        if self._last_pre is not None:
            self._step_times.append(now - self._last_pre)
            del self._step_times[:-20]
        self._last_pre = now
        # sizes change only when the state fills in (or a model is cast): measured again then,
        # and every 256 steps
        key = (id(opt), len(params), len(opt.state), step // 256)
        if self._copy_size is None or self._copy_size[0] != key:
            states = [v for p in params for v in opt.state.get(p, {}).values() if isinstance(v, torch.Tensor)]
            self._copy_size = (key, sum(t.numel() * t.element_size() for t in [*params, *states]) * 2)
        nbytes = self._copy_size[1]
        if nbytes > 64 << 20 or not self._affordable(nbytes, step, opt, history, grad_norm):
            self.copy = None
            return
        t0 = time.perf_counter()
        with torch.no_grad():
            self.copy = (
                step,
                [p.detach().clone() for p in params],
                [None if p.grad is None else p.grad.detach().clone() for p in params],
                {p: {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in opt.state[p].items()}
                 for p in params if p in opt.state},
            )
        self._copy_times.append(time.perf_counter() - t0)
        del self._copy_times[:-9]
        self._cheap = None

    def _affordable(self, nbytes: int, step: int, opt: torch.optim.Optimizer, history: History,
                    grad_norm: float | None) -> bool:
        if self._step_times and self._copy_times:
            # medians: one slow copy (a page fault, a busy core) must not switch copying off;
            # decided again every 8 steps, or after a new copy was timed
            if self._cheap is None or step % 8 == 0:
                copy_time = sorted(self._copy_times)[len(self._copy_times) // 2]
                self._cheap = copy_time <= self.BUDGET * (self.step_time() or 0.0)
            probe = step % 50 == 0  # measure again now and then, even when off
            return self._cheap or probe or self.at_risk(opt, step, history, grad_norm)
        return nbytes <= 16 << 20

    def step_time(self) -> float | None:
        """The median time between the last 20 healthy pre-step hooks (a step), when known."""
        ts = self._step_times
        return sorted(ts)[len(ts) // 2] if ts else None

    def at_risk(self, opt: torch.optim.Optimizer, step: int, history: History,
                norm: float | None) -> bool:
        """Could this update turn finite gradients into non-finite weights or state? Then the copy
        to replay it is kept whatever it costs: gradients large enough for their squares to near
        float32's range (Adam's ``exp_avg_sq``), a gradient norm 100× its usual size, or an
        ``eps`` of 0 (0/0 where a gradient is exactly 0)."""
        if norm is not None and not norm < 1e15:
            return True
        if norm is not None:
            # the median of the last 50 norms, refreshed every 16 steps: this runs at every step
            if self._usual_gn is None or self._usual_gn[0] != step // 16:
                self._usual_gn = (step // 16, history.median("grad_norm", 50))
            usual = self._usual_gn[1]
            if usual is not None and usual > 0 and norm > 100 * usual:
                return True
        return any(isinstance(g.get("eps"), (int, float)) and g["eps"] < 1e-12 for g in opt.param_groups)

    def run(self, opt: torch.optim.Optimizer, step: int, model: nn.Module | None,
            modules: ModuleStack) -> Finding | None:
        """Run ``step``'s update again from the copy made before it, under the locator, then put
        everything back as it is now. ``None`` when no copy was kept."""
        copy = self.copy
        raw = getattr(type(opt).step, "__wrapped__", None)
        if copy is None or copy[0] != step or raw is None:
            return None
        _, pclones, gclones, sclones = copy
        params = [p for g in opt.param_groups for p in g["params"]]
        with torch.no_grad():
            now_p = [p.detach().clone() for p in params]
            now_s = {p: dict(opt.state[p]) for p in params if p in opt.state}
        now_g = [p.grad for p in params]
        loc = Locator(model, modules=modules, options=LocateOptions(
            on_sink="record", unused="ignore", step=step, detected_by="replay", phase="optimizer",
            optimizer="op_by_op"))
        try:
            with torch.no_grad():
                for p, c, g in zip(params, pclones, gclones):
                    p.copy_(c)
                    p.grad = None if g is None else g.clone()
                for p in params:
                    opt.state.pop(p, None)
                for p, st in sclones.items():
                    opt.state[p] = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in st.items()}
            with loc:
                raw(opt)
        except Exception:  # a replay is evidence, never a new failure
            log.debug("nanguard: the replay of the optimizer step failed", exc_info=True)
            return None
        finally:
            with torch.no_grad():
                for p, c, g in zip(params, now_p, now_g):
                    p.copy_(c)
                    p.grad = g
                for p in params:
                    opt.state.pop(p, None)
                for p, st in now_s.items():
                    opt.state[p] = st
        return loc.findings[0] if loc.findings else None
