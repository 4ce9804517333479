"""The step protocol, written once: what every guard does with one training step (framework-free).

Each adapter — the torch hooks, the Keras guard, the Lightning callback — turns its framework's
step into a float-only :class:`Reading` and calls the :class:`StepDriver`, in the order the step
produced them, through a small :class:`StepPort` (what the driver asks of the framework)::

    driver.begin()                          # the step opens (forward, backward)
    driver.check(finite, port, ...)         # before the update: check → agree across ranks →
                                            #   healthy: snapshot, back-off and clipping
                                            #   else:    locate → diagnose → share → act
    driver.check_after(ok, norm, port, ...) # after the update (skip/recover): the weights
    driver.end(reading)                     # the history record; early warnings; the outcome

or, when a dynamic loss scaler skipped the update, :meth:`StepDriver.scaler_skipped`. The stage
moves ``ENDED → OPEN → CHECKED → ENDED``; an event out of that order is a bug of ours and raises
:class:`StepOrderError` (as ``GradScaler`` raises on ``unscale_`` twice). The decision itself is
the :class:`~nanguard.core.controller.StepController`'s (a pure policy over a small state).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Protocol

from .case import RunContext
from .controller import Backend, StepController
from .diagnosis import Diagnosis
from .errors import GiveUpError, NonFiniteError, internal_error
from .finding import Finding
from .history import History, StepRecord
from .ops import update_norm_estimate
from .policy import Action

__all__ = ["Reading", "Stage", "StepDriver", "StepOrderError", "StepPort", "carried_diagnosis"]


class Stage(Enum):
    OPEN = "open"  # the step runs: forward, backward (a closure may run several)
    CHECKED = "checked"  # the check before the update passed, or was acted on
    ENDED = "ended"  # recorded: the next event opens a new step


class StepOrderError(RuntimeError):
    """An event of a step came out of order: an error inside nanguard, never the run's."""


@dataclass(slots=True)
class Reading:
    """One step as the adapter read it: plain numbers, nothing of the framework's.

    ``finite``: the loss and gradients of this rank (before the update). ``grad_norm`` is the
    evidence — from before the script's own clipping when it clipped (``clipped_norm`` after).
    ``opt_type`` and ``num_params`` size the update estimate of the history record."""

    finite: bool = True
    loss: float | None = None
    grad_norm: float | None = None
    clipped_norm: float | None = None
    param_norm: float | None = None
    lr: float | None = None
    opt_type: str | None = None
    optimizer: str | None = None
    num_params: int | None = None
    layer_values: list[float] | None = None
    layer_names: list[str] | None = None
    #: estimate the update's size for the record (not for an update that was never applied)
    estimate_update: bool = True

    def record(self, step: int, finite: bool, skipped: bool, event: str | None) -> StepRecord:
        """The history record of this reading (the one place a step's record is made)."""
        g = self.clipped_norm if self.clipped_norm is not None else self.grad_norm
        return StepRecord(
            step=step, loss=self.loss, grad_norm=self.grad_norm, clipped_norm=self.clipped_norm,
            param_norm=self.param_norm, lr=self.lr,
            update_norm=update_norm_estimate(self.opt_type, self.lr, g, self.num_params or 0)
            if self.estimate_update else None,
            finite=finite, skipped=skipped, event=event, optimizer=self.optimizer,
            layer_values=self.layer_values, layer_names=self.layer_names,
        )


class StepPort(Backend, Protocol):
    """What the driver asks of the framework, for the step in progress (with the controller's
    :class:`~nanguard.core.controller.Backend`, which carries out a decision)."""

    @property
    def eps(self) -> float | None:
        """The optimizer's ``eps`` (``None``: none)."""

    @property
    def adaptive(self) -> bool:
        """An adaptive optimizer: clipping cannot shrink its step."""

    @property
    def script_clip(self) -> float | None:
        """A clipping threshold the script applies itself."""

    def agree(self, ok: bool) -> tuple[bool, list[int]]:
        """``(every rank ok, the ranks that were not)``; one collective under torch.distributed."""

    def locate(self) -> Finding:
        """The finding of this rank's failed step: the replay under the locator, or the watch's
        own numbers said as such."""

    def history(self) -> History:
        """The history the diagnosis reads (the failing optimizer's, when there are several)."""

    def context(self) -> RunContext:
        """What the diagnosis knows of the run (optimizer, hyper-parameters, clipping)."""

    def share(self, finding: Finding | None, diag: Diagnosis | None,
              bad_ranks: list[int]) -> tuple[Finding, Diagnosis]:
        """Every rank gets the same finding (the identity without a process group)."""

    def snapshot(self, before_update: bool) -> None:
        """A healthy step: keep a snapshot if one is due (skip/recover)."""

    def apply_settings(self, lr_scale: float, clip_norm: float | None) -> None:
        """A healthy step under a back-off: clip, and scale the learning rate for this update."""


@dataclass
class StepDriver:
    """The protocol of one guarded step (see the module docstring). One per guard.

    Attributes:
        step: the index of the step in progress (every optimizer's step counts).
        skipped: whether the step's update was kept from the weights (accelerate's
            ``step_was_skipped``).
        on_end: called after every step's record (live status, TensorBoard, a tracer).
    """

    controller: StepController
    step: int = 0
    stage: Stage = Stage.ENDED
    skipped: bool = False
    event: str | None = None
    on_end: list[Callable[[], None]] = field(default_factory=list)

    @property
    def policy(self) -> str:
        return self.controller.config.policy

    # --- the stages -----------------------------------------------------------------------------
    def begin(self) -> None:
        """The step opens (its first forward, or the optimizer's step hook). Idempotent within a
        step: a closure's several forward/backward passes are one step."""
        if self.stage is Stage.ENDED:
            self.stage, self.skipped, self.event = Stage.OPEN, False, None

    def _expect(self, *stages: Stage, what: str) -> None:
        if self.stage not in stages:
            raise StepOrderError(f"nanguard: {what} at stage {self.stage.value} of step {self.step} "
                                 f"(expected {' or '.join(s.value for s in stages)}): an error inside "
                                 "nanguard, please report it")

    def check(self, finite: bool, port: StepPort, *, checks_after: bool,
              prior: tuple[Finding, Diagnosis] | None = None, note: str | None = None) -> bool:
        """Before the update: the loss and gradients were read (``finite``: on this rank). Every rank
        agrees; a healthy step is counted (unless the weights are checked after the update:
        ``checks_after``), snapshotted and given the back-off in force; a failed one is located,
        diagnosed, shared and acted on. ``prior``: a finding known before this check (the last
        update left the weights non-finite), acted on now that every rank agrees. Returns
        whether the step is healthy. Raises what the controller raises (``raise``, give-up)."""
        self.begin()
        self._expect(Stage.OPEN, Stage.CHECKED, what="the check before the update")
        ok, bad_ranks = port.agree(finite and prior is None)
        self.stage = Stage.CHECKED
        if ok:
            if not checks_after:
                self.controller.healthy()
            port.snapshot(True)
            state = self.controller.state
            port.apply_settings(state.lr_scale, state.clip_norm)
            return True
        if prior is not None:
            finding, diag = port.share(*prior, bad_ranks)
            self.act(finding, diag, port, rollback_weights=True)
            return False
        self.fail(port, bad_ranks, located=not finite or not bad_ranks, note=note)
        return False

    def fail(self, port: StepPort, bad_ranks: list[int] | None = None, *, located: bool = True,
             note: str | None = None, step: int | None = None) -> None:
        """A failed step (``step``: an earlier one, read late by the deferred watch): located on
        this rank (``located``: this rank failed, or no rank said which), diagnosed, shared with
        every rank, acted on."""
        finding = diag = None
        if located:
            finding = port.locate()
            if note:
                finding.details["note"] = note
            if not self.controller.history.healthy():
                finding.details.setdefault("first_step", True)
            diag = self.diagnose(finding, port)
        finding, diag = port.share(finding, diag, list(bad_ranks or []))
        self.act(finding, diag, port, step=step)

    def check_after(self, weights_finite: bool, port: StepPort, finding: Callable[[], Finding],
                    rollback_weights: bool = True,
                    later: Callable[[Finding, Diagnosis], None] | None = None) -> bool:
        """After the update (skip/recover, or a framework that checks both at once): were the
        weights and state left finite? A healthy update is counted (unless the step was skipped)
        and may be snapshotted; a failed one (``finding()`` makes its finding) is acted on:
        rolled back — or, with ``later``, handed over to be acted on at the next check (under
        torch.distributed every rank must agree first)."""
        self._expect(Stage.OPEN, Stage.CHECKED, what="the check after the update")
        if weights_finite:
            if not self.skipped:
                self.controller.healthy()  # gradients and the update both checked
            port.snapshot(False)
            return True
        if self.skipped:
            return False
        f = finding()
        diag = self.diagnose(f, port)
        if later is not None:
            later(f, diag)
        else:
            self.act(f, diag, port, after_update=True, rollback_weights=rollback_weights)
        return False

    def diagnose(self, finding: Finding, port: StepPort) -> Diagnosis:
        """The cause of ``finding``, from the run's history (a value carried across steps takes
        the cause of the run's first event)."""
        from .diagnosis import diagnose

        diag = diagnose(finding, port.history(), port.context())
        if finding.details.get("origin") == "carried":
            first = self.controller.findings[0] if self.controller.findings else None
            diag = carried_diagnosis(finding, first, diag)
        return diag

    def act(self, finding: Finding, diag: Diagnosis, port: StepPort, *, after_update: bool = False,
            rollback_weights: bool = False, step: int | None = None) -> Action:
        """The controller decides; ``port`` carries it out. The step is marked skipped."""
        self.skipped = True
        diag = self._advice_tried(finding, diag, port, self.step if step is None else step)
        try:
            action = self.controller.act(
                finding, diag, port, step=self.step if step is None else step, eps=port.eps,
                after_update=after_update,
                rollback_weights=rollback_weights, script_clip=port.script_clip, adaptive=port.adaptive,
            )
        except GiveUpError:
            self.event = "give_up"
            raise
        except NonFiniteError:
            self.event = "nonfinite"
            raise
        self.event = action.kind
        return action

    def _advice_tried(self, finding: Finding, diag: Diagnosis, port: StepPort, step: int) -> Diagnosis:
        """Policy ``raise``, before the finding is raised: the fixes ``recover`` would try, tried
        on the failing step (:meth:`StepController.advice_trials`), and the diagnosis written
        again with what they showed — the learning rate that trained, or the ones that did not
        (:mod:`nanguard.core.rules.fixes`). The cause is the same; only the advice changes."""
        if self.policy != "raise" or finding.details.get("origin") == "carried":
            return diag
        try:
            trials = self.controller.advice_trials(diag, port, step=step, eps=port.eps,
                                                   script_clip=port.script_clip, adaptive=port.adaptive)
            if not trials:
                return diag
            from .diagnosis import diagnose

            tried = diagnose(finding, port.history(), replace(port.context(), trials=tuple(trials)))
        except Exception as exc:  # the finding stands as it was, untried
            internal_error("trying the advice on the failing step", exc)
            return diag
        if tried.cause is not diag.cause:
            tried = diag  # a rank's own history read otherwise: keep the shared diagnosis
        tried.trials = [t.to_dict() for t in trials]
        return tried

    def scaler_skipped(self, port: StepPort, *, nan_loss: bool, scale: float | None,
                       name: str | None = None) -> bool:
        """A dynamic loss scaler skipped the update: its own business while it has room to lower
        its scale (never a finding, also before the first update; the step is recorded as a
        ``scaler-skip``), else a failure located, diagnosed and acted on with the reason.
        Returns whether it was the scaler's business. ``name``: the scaler's own name for the
        note (``LossScaleOptimizer``)."""
        self.begin()
        reason = self.controller.scaler_skipped(nan_loss=nan_loss, scale=scale)
        self.stage = Stage.CHECKED
        self.skipped = True
        if reason is None:
            self.event = "scaler-skip"
            return True
        self.fail(port, note=reason.replace("the loss scaler", name) if name else reason)
        return False

    def stale(self, port: StepPort) -> None:
        """A rollback taken at another optimizer's step replaced the weights this step's
        gradients were computed on: its update is skipped, unchecked (its loss and gradients
        belong to the weights before the rollback), and it is no healthy step."""
        self.begin()
        self._expect(Stage.OPEN, what="a stale step's skip")
        self.stage, self.skipped, self.event = Stage.CHECKED, True, "stale"
        port.skip_update()

    def abandon(self) -> None:
        """The step stopped on an error of the script's own before it was checked: nothing is
        recorded of it; the next event opens a new step."""
        self.stage, self.event = Stage.ENDED, None

    def end(self, reading: Reading | None, finite: bool | None = None,
            between: Callable[[], None] | None = None) -> StepRecord:
        """The step ends (healthy or not, also when it raised): its history record, then the
        early warnings and the outcome of a recovery read it; the counter moves on. ``finite``:
        the step's verdict when the reading alone does not give it (a step that raised)."""
        r = reading if reading is not None else Reading()
        ok = r.finite if finite is None else finite
        event = self.event or (None if ok else "nonfinite")
        rec = r.record(self.step, ok, self.skipped, event)
        self.controller.history.append(rec)
        self.stage = Stage.ENDED
        self.step += 1
        self.event = None
        if between is not None:
            between()  # the adapter's own end of step (its per-step state emptied), before the
            # early warnings and the outcome read the record
        self.controller.step_ended()
        for fn in self.on_end:
            fn()
        return rec


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
