"""How a torch guard turns a failed check into a :class:`~nanguard.core.finding.Finding`.

Runs only after the fused check failed: the step is replayed under the locator
(:func:`locate_step`); where the replay cannot name the op, the watch's own numbers make the
finding (:func:`watch_finding`). A failed check *after* an update is the optimizer's
(:func:`optimizer_finding`, with the update replayed op by op when a copy was kept), or — before
any update — weights that came in non-finite (:func:`parameter_finding`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..core.diagnosis import Diagnosis
from ..core.errors import internal_error
from ..core.finding import Finding
from ..core.source import user_frame
from . import _dist
from ._recorder import carried_inputs
from ._stats import finding_for
from .replay import replay
from .watch import NormCheck

if TYPE_CHECKING:
    from ._guard_base import GuardBase as Guard

__all__ = ["carried_diagnosis", "locate_step", "optimizer_finding", "parameter_finding", "watch_finding"]


def _module_of(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else ""


def locate_step(guard: Guard, chk: NormCheck, params: Sequence[torch.Tensor]) -> Finding:
    """Replay the step's recorded events under the locator; the finding of the op that made
    the value (or the watch's, with a note, when the replay did not reproduce it)."""
    finding = None
    extra: dict[str, Any] = {}
    if guard.replay_enabled and guard.recorder.events:
        try:
            finding, extra = replay(
                guard.recorder.events, model=guard.model, modules=guard.modules, step=guard.step,
                sinks=guard._sinks,
            )
        except Exception as exc:  # a bug of ours: said as such, never as a fact about the run
            extra = {"error": internal_error("the replay of this step", exc)}
    if finding is None and guard.recorder.graph_finding is not None:
        finding = guard.recorder.graph_finding  # the tape was not whole: what the graph showed
    if finding is None:
        finding = watch_finding(guard, chk, params)
        if extra.get("error"):
            finding.details["note"] = (f"{extra['error']} (an error inside nanguard, not in the run); "
                                       "run with nanguard.locate() / --trace for the exact op")
            finding.details["replay_error"] = extra["error"]
        elif guard.replay_enabled:
            finding.details.setdefault(
                "note",
                "the replay of this step did not reproduce the non-finite value; "
                "run with nanguard.locate() / --trace for the exact op",
            )
    scale = extra.get("activation_scale") or []
    if scale:
        finding.details.setdefault("activation_scale", scale[:32])
    if finding.phase == "data":
        _mark_carried(guard, finding)
        _mark_unrecorded(guard, finding)
    if _dist.active():
        finding.rank = _dist.rank()
    return finding


def _mark_unrecorded(guard: Guard, finding: Finding) -> None:
    """A non-finite input in a step where the recorder stood aside for ``no_grad`` forwards
    (an RL rollout) and no ``DataLoader`` handed out a batch: it was made by ops nanguard did
    not record (a return, an advantage, an observation the script built), so it is not called
    loaded data; where it entered the update is all that is known."""
    rec = guard.recorder
    if finding.details.get("origin") == "data" and rec.stood_aside and not rec.loaded_batch:
        finding.details["origin"] = "unrecorded"


def _mark_carried(guard: Guard, finding: Finding) -> None:
    """A non-finite model input that the model itself returned at the previous step — which
    was non-finite — is state the script carries across steps (an RNN's ``hidden``), not data:
    no batch can be dropped for it and a rollback does not reset it."""
    prev = guard.history[-1] if len(guard.history) else None
    if prev is None or prev.finite:
        return
    bad = [t for t in carried_inputs(guard.recorder) if not bool(torch.isfinite(t).all())]
    if not bad:
        return
    first = next((f for f, _ in guard.findings), None)
    finding.details["origin"] = "carried"
    finding.details["carried_from_step"] = prev.step
    if first is not None:
        finding.details["first_event"] = {"step": first.step, "op": first.op, "module": first.module,
                                          "phase": first.phase}
    finding.details["note"] = (
        f"this input is what the model returned at step {prev.step} (non-finite then), passed back "
        "in by the script: state carried across steps, which a rollback does not reset")


def watch_finding(guard: Guard, chk: NormCheck, params: Sequence[torch.Tensor]) -> Finding:
    """What the fused check itself saw: the first non-finite gradient, or the loss."""
    names = guard.watch.param_names()
    bad = [params[i] for i in chk.bad if i < len(params)]
    if bad and all(math.isfinite(v) for v in chk.losses):  # a non-finite loss came first
        g = bad[0].grad
        assert g is not None
        pnames = [names.get(id(p), "?") for p in bad]
        return finding_for(
            g, "backward", None, module=_module_of(pnames[0]), step=guard.step,
            reached="gradients", detected_by="watch", details={"gradients": pnames},
        )
    return Finding(
        phase="forward", op=None, step=guard.step, reached="loss", detected_by="watch",
        details={"losses": [v if math.isfinite(v) else str(v) for v in chk.losses]},
    )


def optimizer_finding(guard: Guard, opt: torch.optim.Optimizer, pchk: NormCheck, step: int,
                      wnames: Sequence[str]) -> Finding:
    """The weights (or the optimizer state) were finite before ``step``'s update and are not
    after it. The update is replayed op by op when a copy from before it was affordable."""
    weights, _ = guard.watch.weights(opt)
    badn = [wnames[i] for i in pchk.bad if i < len(wnames)]
    first = weights[pchk.bad[0]] if pchk.bad else weights[0]
    params = [n for n in badn if ":" not in n]
    state = [n for n in badn if ":" in n]
    pending = guard._pending
    finding = guard.update_replay.run(opt, step, guard.model, guard.modules)
    if finding is None:
        loc = user_frame(2)
        finding = finding_for(
            first, "optimizer", f"{type(opt).__name__}.step",
            source=loc.short if loc else None, source_code=loc.code if loc else None,
            step=step, reached="parameters" if params else "optimizer state", detected_by="watch",
            details={"note": "the op inside the optimizer step was not replayed (a copy of the "
                     "state before each step costs too much here); nanguard run --trace names it"},
        )
    name0 = (params or state or ["?"])[0].split(":")[0]
    if finding.module is None:
        finding.module = _module_of(name0)
    finding.rank = _dist.rank() if _dist.active() else None
    finding.details.setdefault("parameters", params)
    if state:
        finding.details["optimizer_state"] = state
    rec = next((r for r in reversed(guard.history.last(3)) if r.step == step), None)
    # checked after the update: the step's record holds its gradients
    finding.details["grads_finite"] = rec.finite if rec is not None else (pending is None or pending.finite)
    gn = rec.grad_norm if rec is not None else (pending.norm if pending else None)
    if gn is not None:
        finding.details["grad_norm"] = gn
    return finding


def parameter_finding(guard: Guard, pchk: NormCheck, wnames: Sequence[str]) -> Finding:
    """Weights non-finite before the first update: they came in that way."""
    primary = guard.watch.primary
    weights, _ = guard.watch.weights(primary) if primary is not None else ([], [])
    badn = [wnames[i] for i in pchk.bad if i < len(wnames)]
    first = weights[pchk.bad[0]] if pchk.bad and weights else None
    name0 = badn[0] if badn else "?"
    if not guard._updated:
        guard._bad_from_start.update(n.split(":")[0] for n in badn)
    return finding_for(
        first, "forward", "parameter", module=_module_of(name0), step=guard.step,
        reached="parameters", detected_by="watch", rank=_dist.rank() if _dist.active() else None,
        details={"origin": "parameter", "parameters": badn,
                 "note": "found before the first update: the weights came in non-finite"},
    )


def carried_diagnosis(finding: Finding, first: tuple[Finding, Diagnosis] | None,
                      diag: Diagnosis) -> Diagnosis:
    """The diagnosis of a value carried across steps: the cause of the first event of the run,
    which made it (``diag``, the data diagnosis, when there was none)."""
    if first is None:
        return diag
    f0, d0 = first
    k = finding.details.get("carried_from_step")
    where = f"`{f0.op}`" + (f" in `{f0.module}`" if f0.module else "")
    return Diagnosis(
        cause=d0.cause,
        confidence=d0.confidence,
        summary=f"state the script carries across steps is still non-finite: {d0.summary}",
        evidence=[
            f"the non-finite input at step {finding.step} is what the model returned at step {k} "
            "and the script passed back in (an RNN's hidden state, a running value); a rollback "
            "restores weights and optimizer state, not this tensor",
            f"the first non-finite value of the run was made at step {f0.step} by {where}",
            *d0.evidence,
        ],
        fixes=[
            "hidden = hidden.detach()\nif not torch.isfinite(hidden).all():\n    "
            "hidden = torch.zeros_like(hidden)  # start carried state over after a bad step",
            *d0.fixes,
        ],
    )
