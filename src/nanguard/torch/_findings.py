"""How a torch guard turns a failed check into a :class:`~nanguard.core.finding.Finding`.

Runs only after the fused check failed: the step is replayed under the locator
(:meth:`Replayer.locate`); where the replay cannot name the op, the watch's own numbers make the
finding (:meth:`Replayer.watch_finding`) — and where the replay itself failed, the finding says
so, as an error of nanguard's, never as a fact about the run. A failed check *after* an update
is the optimizer's (:meth:`Replayer.optimizer_finding`, with the update replayed op by op when a
copy was kept), or — before any update — weights that came in non-finite
(:meth:`Replayer.parameter_finding`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..core.controller import StepController
from ..core.errors import internal_error
from ..core.finding import Finding
from ..core.source import user_frame
from . import _dist
from ._modules import ModuleStack
from ._recorder import Event, StepRecorder, carried_inputs
from ._stats import finding_for
from ._update_replay import UpdateReplay
from ._watched import WatchSet
from .replay import replay
from .watch import NormCheck

__all__ = ["Replayer", "module_of"]


def module_of(name: str) -> str:
    """The module that owns the weight ``name`` (``"encoder.fc1"`` for ``"encoder.fc1.weight"``;
    ``""`` — the model itself — for a weight of the root; an optimizer state's ``:exp_avg`` is
    dropped first)."""
    name = name.split(":")[0]
    return name.rsplit(".", 1)[0] if "." in name else ""


class Replayer:
    """Makes the finding of a failed step: the replay of its recorded events under the locator,
    the replay of a failed update, or the watch's own numbers."""

    def __init__(self, model: nn.Module | None, modules: ModuleStack, recorder: StepRecorder,
                 watch: WatchSet, controller: StepController, enabled: bool = True) -> None:
        self.model = model
        self.modules = modules
        self.recorder = recorder
        self.watch = watch
        self.controller = controller
        self.enabled = enabled
        #: the copy kept before a healthy update, to replay it if it made the weights non-finite
        self.updates = UpdateReplay()

    def locate(self, chk: NormCheck, params: Sequence[torch.Tensor], step: int, sinks: Sequence[Any],
               events: Sequence[Event] | None = None) -> Finding:
        """Replay the step's recorded events (``events``: a past step's, for the deferred watch)
        under the locator; the finding of the op that made the value — or the watch's, with a
        note saying why the replay did not name it."""
        events = self.recorder.events if events is None else events
        finding = None
        extra: dict[str, Any] = {}
        if self.enabled and events:
            try:
                finding, extra = replay(events, model=self.model, modules=self.modules, step=step,
                                        sinks=sinks)
            except Exception as exc:  # a bug of ours: said as such, never as a fact about the run
                extra = {"error": internal_error("the replay of this step", exc)}
        if finding is None and self.recorder.graph_finding is not None:
            finding = self.recorder.graph_finding  # the tape was not whole: what the graph showed
        if finding is None:
            finding = self.watch_finding(chk, params, step)
            if extra.get("error"):
                finding.details["note"] = (f"{extra['error']} (an error inside nanguard, not in the run); "
                                           "run with nanguard.locate() / --trace for the exact op")
                finding.details["replay_error"] = extra["error"]
            elif self.enabled:
                finding.details.setdefault(
                    "note",
                    "the replay of this step did not reproduce the non-finite value; "
                    "run with nanguard.locate() / --trace for the exact op",
                )
        scale = extra.get("activation_scale") or []
        if scale:
            finding.details.setdefault("activation_scale", scale[:32])
        if finding.phase == "data":
            self._mark_carried(finding)
            self._mark_unrecorded(finding)
        if _dist.active():
            finding.rank = _dist.rank()
        return finding

    def _mark_unrecorded(self, finding: Finding) -> None:
        """A non-finite input in a step where the recorder stood aside for ``no_grad`` forwards
        (an RL rollout) and no ``DataLoader`` handed out a batch: it was made by ops nanguard did
        not record (a return, an advantage, an observation the script built), so it is not called
        loaded data; where it entered the update is all that is known."""
        rec = self.recorder
        if finding.details.get("origin") == "data" and rec.stood_aside and not rec.loaded_batch:
            finding.details["origin"] = "unrecorded"

    def _mark_carried(self, finding: Finding) -> None:
        """A non-finite model input that the model itself returned at the previous step — which
        was non-finite — is state the script carries across steps (an RNN's ``hidden``), not data:
        no batch can be dropped for it and a rollback does not reset it."""
        history = self.controller.history
        prev = history[-1] if len(history) else None
        if prev is None or prev.finite:
            return
        bad = [t for t in carried_inputs(self.recorder) if not bool(torch.isfinite(t).all())]
        if not bad:
            return
        first = next((f for f, _ in self.controller.findings), None)
        finding.details["origin"] = "carried"
        finding.details["carried_from_step"] = prev.step
        if first is not None:
            finding.details["first_event"] = {"step": first.step, "op": first.op, "module": first.module,
                                              "phase": first.phase}
        finding.details["note"] = (
            f"this input is what the model returned at step {prev.step} (non-finite then), passed back "
            "in by the script: state carried across steps, which a rollback does not reset")

    def watch_finding(self, chk: NormCheck, params: Sequence[torch.Tensor], step: int) -> Finding:
        """What the fused check itself saw: the first non-finite gradient, or the loss."""
        names = self.watch.param_names()
        bad = [params[i] for i in chk.bad if i < len(params)]
        if bad and all(math.isfinite(v) for v in chk.losses):  # a non-finite loss came first
            g = bad[0].grad
            assert g is not None
            pnames = [names.get(id(p), "?") for p in bad]
            return finding_for(
                g, "backward", None, module=module_of(pnames[0]), step=step,
                reached="gradients", detected_by="watch", details={"gradients": pnames},
            )
        return finding_for(
            None, "forward", None, step=step, reached="loss", detected_by="watch",
            details={"losses": [v if math.isfinite(v) else str(v) for v in chk.losses]},
        )

    def optimizer_finding(self, opt: torch.optim.Optimizer, pchk: NormCheck, step: int,
                          wnames: Sequence[str], pending: NormCheck | None) -> Finding:
        """The weights (or the optimizer state) were finite before ``step``'s update and are not
        after it. The update is replayed op by op when a copy from before it was affordable."""
        weights, _ = self.watch.weights(opt)
        badn = [wnames[i] for i in pchk.bad if i < len(wnames)]
        first = weights[pchk.bad[0]] if pchk.bad else weights[0]
        params = [n for n in badn if ":" not in n]
        state = [n for n in badn if ":" in n]
        finding = self.updates.run(opt, step, self.model, self.modules)
        if finding is None:
            loc = user_frame(2)
            finding = finding_for(
                first, "optimizer", f"{type(opt).__name__}.step",
                source=loc.short if loc else None, source_code=loc.code if loc else None,
                step=step, reached="parameters" if params else "optimizer state", detected_by="watch",
                details={"note": "the op inside the optimizer step was not replayed (a copy of the "
                         "state before each step costs too much here); nanguard run --trace names it"},
            )
        if finding.module is None:
            finding.module = module_of((params or state or ["?"])[0])
        finding.rank = _dist.rank() if _dist.active() else None
        finding.details.setdefault("parameters", params)
        if state:
            finding.details["optimizer_state"] = state
        history = self.controller.history
        rec = next((r for r in reversed(history.last(3)) if r.step == step), None)
        # checked after the update: the step's record holds its gradients
        finding.details["grads_finite"] = rec.finite if rec is not None else (pending is None or pending.finite)
        gn = rec.grad_norm if rec is not None else (pending.norm if pending else None)
        if gn is not None:
            finding.details["grad_norm"] = gn
        return finding

    def parameter_finding(self, pchk: NormCheck, wnames: Sequence[str], step: int) -> Finding:
        """Weights non-finite before the first update: they came in that way."""
        primary = self.watch.primary
        weights, _ = self.watch.weights(primary) if primary is not None else ([], [])
        badn = [wnames[i] for i in pchk.bad if i < len(wnames)]
        first = weights[pchk.bad[0]] if pchk.bad and weights else None
        name0 = badn[0] if badn else "?"
        if not self.watch.state.updated:
            self.watch.state.bad_from_start.update(n.split(":")[0] for n in badn)
        return finding_for(
            first, "forward", "parameter", module=module_of(name0), step=step,
            reached="parameters", detected_by="watch", rank=_dist.rank() if _dist.active() else None,
            details={"origin": "parameter", "parameters": badn,
                     "note": "found before the first update: the weights came in non-finite"},
        )
