"""What the step driver asks of torch for one step: the :class:`~nanguard.core.step.StepPort`.

Made by the hooks when a step is checked (and by the deferred watch for a step read late): it
names the step's tensors (``params``, the optimizer, the check), and passes each request to the
part of the guard that owns it — the replayer (``locate``), the actuator (every change to the
user's objects), torch.distributed (``agree``, ``share``).
"""

from __future__ import annotations

import inspect
import math
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from ..core.case import RunContext
from ..core.controller import StepController
from ..core.diagnosis import Diagnosis
from ..core.finding import Finding
from ..core.history import History
from ..core.ops import ADAPTIVE_OPTIMIZERS
from ..core.trials import Fix, Trial, combine_ranks
from . import _dist
from ._backend import Actuator
from ._collectives import LocalShards, fsdp_modules
from ._datascale import collect, measure
from ._recorder import Event, RootCall
from ._script_names import script_names
from ._watched import HYPER, WatchSet, opt_params, plain
from .watch import NormCheck

if TYPE_CHECKING:
    from .guard import Guard

__all__ = ["TorchPort", "run_context"]


def kept_args(opt: torch.optim.Optimizer | None) -> dict[str, Any]:
    """The arguments of ``opt`` (its first param group's) that differ from its class's defaults,
    besides the learning rate: what a suggested ``torch.optim.X(...)`` line keeps. Read after a
    failure only."""
    if opt is None or not opt.param_groups:
        return {}
    try:
        sig = inspect.signature(type(opt).__init__)
    except (TypeError, ValueError):  # a C extension's optimizer: nothing to compare with
        return {}
    g, out = opt.param_groups[0], {}
    for name, p in sig.parameters.items():
        if name in ("self", "params", "lr") or name not in g or p.default is inspect.Parameter.empty:
            continue
        v = plain(g[name])
        if isinstance(v, (bool, int, float, tuple)) and not isinstance(p.default, torch.Tensor) and v != p.default:
            out[name] = v
    return out


def run_context(watch: WatchSet, actuator: Actuator, controller: StepController, opt: torch.optim.Optimizer | None,
                script_clip: float | None, recurrences: dict[str, tuple[float, float]] | None) -> RunContext:
    """What the diagnosis knows of the run: the hyper-parameters of ``opt`` (the optimizer whose
    step failed; by default the first one stepped), its scheduler, any clipping."""
    primary = opt is None or opt is watch.primary
    opt = watch.primary if opt is None else opt
    state = controller.state
    hyper: dict[str, Any] = {}
    if opt is not None and opt.param_groups:
        g = opt.param_groups[0]
        hyper = {k: plain(g[k]) for k in HYPER if k in g}
        if "lr" in hyper and isinstance(hyper["lr"], float):
            hyper["lr"] *= state.lr_scale
    params = watch.params() if primary else opt_params(opt)
    scheds = actuator.schedulers_of(opt)
    return RunContext(
        framework="torch",
        optimizer=type(opt).__name__ if opt is not None else None,
        hyper=hyper,
        kept=kept_args(opt),
        clip_norm=script_clip if script_clip is not None else state.clip_norm,
        num_params=sum(p.numel() for p in params) or None,
        scheduler=type(scheds[0]).__name__ if scheds else None,
        lr_scale=state.lr_scale,
        loss_scaler=bool(actuator.scalers_all()),
        names=script_names(opt),
        argv=tuple(sys.argv[1:]),
        recurrences=dict(recurrences or {}),
    )


class TorchPort:
    """The step port of one torch step (see the module docstring). Made at every check, so it
    only names the step's tensors; what a failure needs (``eps``, the context) is read then."""

    def __init__(self, guard: Guard, params: Sequence[torch.Tensor], opt: torch.optim.Optimizer | None,
                 check: NormCheck, sinks: Sequence[Any], step: int,
                 events: Sequence[Event] | None = None) -> None:
        self.guard, self.actuator, self.replayer = guard, guard.actuator, guard.replayer
        self.params, self.opt, self.chk = params, opt, check
        self.step, self.sinks, self.events = step, sinks, events
        self.shards = LocalShards([])

    @property
    def eps(self) -> float | None:
        opt = self.opt
        e = opt.param_groups[0].get("eps") if opt is not None and opt.param_groups else None
        return float(e) if isinstance(e, (int, float)) else None

    @property
    def adaptive(self) -> bool:
        return self.opt is not None and type(self.opt).__name__ in ADAPTIVE_OPTIMIZERS

    @property
    def script_clip(self) -> float | None:
        return self.guard.clip_norm

    # --- what the driver asks ------------------------------------------------------------------
    def agree(self, ok: bool) -> tuple[bool, list[int]]:
        if not _dist.active():  # one process: nothing to agree on, nothing summed per step
            return ok, ([] if ok else [0])
        st = self.guard.opt_hooks.step
        mine = self.events is None  # the step in progress (not an earlier one read late)
        n = st.n_losses if mine else 0
        loss = math.fsum(self.chk.losses[:n]) if n else None
        agreed, bad, mean = _dist.agree(ok, self.params, loss)
        if mean is not None:
            st.ranks_loss = mean  # the history's loss: the same on every rank
        if not agreed:  # every rank is here: FSDP2's modules gathered for a replay on one rank
            self.shards = LocalShards(fsdp_modules(self._roots()))
            self.shards.gather()
        return agreed, bad

    def _roots(self) -> list[torch.nn.Module | None]:
        events = self.events if self.events is not None else self.replayer.recorder.events
        return [self.replayer.model, *(ev.module for ev in events if isinstance(ev, RootCall))]

    def locate(self) -> Finding:
        try:
            finding = self.replayer.locate(self.chk, self.params, self.step, self.sinks, self.events)
        finally:
            self.shards.release()
        if self.shards.skipped:
            finding.details.setdefault("note", f"not replayed: {self.shards.skipped}")
        return finding

    def history(self) -> History:
        h = self.guard.history
        return h.of(self.actuator.watch.optimizer_name(self.opt)) if self.opt is not None else h

    def context(self) -> RunContext:
        """At a failure: the run's context, with the scale of the run's first data (read at the
        end of its first step; at a failure of the first step, read now)."""
        look = self.guard.data
        scale = look.scale if look.scale_read else measure(collect(self.replayer.recorder.capture))
        return replace(self.guard.context(self.opt), data_scale=scale)

    def share(self, finding: Finding | None, diag: Diagnosis | None,
              bad_ranks: list[int]) -> tuple[Finding, Diagnosis]:
        self.shards.release()  # a rank that did not replay
        if _dist.active():
            return _dist.share(finding, diag, bad_ranks)
        assert finding is not None and diag is not None
        return finding, diag

    def snapshot(self, before_update: bool) -> None:
        primary = self.opt is self.actuator.watch.primary or self.opt is None
        self.actuator.maybe_snapshot(self.step, before_update, primary)

    def apply_settings(self, lr_scale: float, clip_norm: float | None) -> None:
        if lr_scale == 1.0 and clip_norm is None:
            return  # no back-off in force: every healthy step of most runs
        once = self.guard.opt_hooks.step
        if once.settings_applied:
            return  # once per step: a closure runs several checks
        once.settings_applied = True
        self.actuator.apply_settings(self.params, self.opt, self.chk.norm)

    # --- the controller's Backend ---------------------------------------------------------------
    def skip_update(self) -> None:
        self.actuator.skip_update(self.params, self.opt)

    def rollback(self, older: bool = False) -> int | None:
        return self.actuator.rollback(older, current=self.opt)

    def trial(self, fixes: list[Fix]) -> list[Trial] | None:
        events = self.replayer.recorder.events if self.events is None else self.events
        recorder = self.replayer.recorder

        def hold(on: bool) -> None:
            if on:
                recorder.hold()
            else:
                recorder.release(push=False)

        scaled = bool(self.guard.opt_hooks.step.unscaled)
        ranks = _dist.active()  # every rank tries every fix, then they agree on what worked
        trials = self.actuator.trial(events, self.params, self.opt, fixes, self.script_clip, scaled, hold,
                                     stop_early=not ranks)
        return combine_ranks(_dist.gather(trials)) if ranks else trials

    def across_ranks(self, values: tuple[float | None, ...]) -> list[tuple[float | None, ...]]:
        return _dist.gather(values)

    def settings_changed(self) -> None:
        return None  # the pre-step hook reads the back-off and the clip at every step

    def set_eps(self, eps: float) -> None:
        self.actuator.set_eps(self.opt, eps)

    def weight_decay_settable(self) -> bool:
        return self.opt is not None and any(
            isinstance(g.get("weight_decay"), (int, float)) and g["weight_decay"] > 0 for g in self.opt.param_groups)

    def set_weight_decay(self, weight_decay: float) -> None:
        self.actuator.set_weight_decay(self.opt, weight_decay)

    def restore_state(self) -> dict[str, Any]:
        return self.actuator.restore_state()
