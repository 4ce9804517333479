"""The step controller: what a guard decides about a training step, written once (framework-free).

Every guard — the torch :class:`~nanguard.torch.guard.Guard`, the Keras guard, the Lightning and
Hugging Face callbacks — watches its framework's step in its own way (hooks, a traced check, a
callback) and then hands the controller the same few events, in the order the step produced
them:

=====================  ==================================================================
event                  when in the step
=====================  ==================================================================
``scaler_skipped``     a dynamic loss scaler skipped the update (after its ``step``)
``scaler_stepped``     the loss scaler let the update through
``healthy``            the fused check of loss, gradients (and weights) passed
``act``                the check failed: the finding is located and diagnosed; decide
``raised``/``cleared`` the guard raised a finding as an error / the next step began
=====================  ==================================================================

The decision itself is pure (:meth:`Recovery.decide` returns an :class:`Action`); carrying it
out is the adapter's, through the small :class:`Backend` interface (skip the update, roll back,
set ``eps``, restore what a bad batch poisoned). The controller keeps what a resumed run needs
(:meth:`state_dict`): the learning-rate factor, the clipping threshold, the counters.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, cast

from .diagnosis import Diagnosis
from .early import EarlyWarning, EarlyWarnings
from .errors import GiveUpError, NonFiniteError
from .finding import Finding
from .growth import Regrowth
from .history import History
from .outcome import LEVEL_STEPS, Level, OutcomeJudge, healthy_now
from .policy import ROLLBACK, Action, RecoveryConfig, RecoveryState, decide, loss_scale_gave_up
from .primary import PrimarySteps
from .ranks import say
from .render import event_line
from .taxonomy import Cause
from .trials import Fix, Trial, lr_candidates

__all__ = ["DROP_WINDOW", "MAX_FORCED_DROPS", "MAX_REPEATED_DROPS", "Backend", "StepController", "clip_suggestion"]

#: ``recover`` stops after this many dropped batches from one source within :data:`DROP_WINDOW`
#: steps, when they are half or more of the steps since the first of them
MAX_REPEATED_DROPS = 5
DROP_WINDOW = 100
#: ``recover`` stops after this many batches of a rollback cause dropped in a run (each step
#: failed at the healthy weights whatever the fix): however far apart, they are not a bad batch
MAX_FORCED_DROPS = 10

log = logging.getLogger("nanguard")


class Backend(Protocol):
    """What a guard can do to its framework's run. Called by :meth:`StepController.act` after a
    non-finite step, in this order: ``trial`` (rollback causes), ``rollback`` (if the action
    rolls back), ``set_eps``, ``restore_state``, ``skip_update`` (unless the update was already
    applied); and at the end of a later step, ``rollback(older=True)`` + ``settings_changed``
    when a recovery did not bring the run back (an escalation)."""

    def skip_update(self) -> None:
        """Make sure this step's update is never applied."""

    def rollback(self, older: bool = False) -> int | None:
        """Restore the newest healthy snapshot (``older``: the one before it, where there is
        one); return its step (``None``: there is none)."""

    def trial(self, fixes: list[Fix]) -> list[Trial] | None:
        """Try each fix from the newest snapshot on the failing step's batch (see
        :mod:`nanguard.core.trials`), leaving the run at that snapshot; ``None``: this backend
        cannot re-run a step (the fix is then applied on trial and judged by the outcome)."""

    def across_ranks(self, values: tuple[float | None, ...]) -> list[tuple[float | None, ...]]:
        """Every rank's ``values`` (one collective under torch.distributed, after a failure
        only); ``[values]`` without ranks. What the decision reads of a rank's own history (the
        update/weight ratio of its shard of the weights) is agreed through it, so that every
        rank decides the same."""

    def settings_changed(self) -> None:
        """The learning-rate factor or clipping changed outside :meth:`StepController.act`."""

    def set_eps(self, eps: float) -> None:
        """Raise the optimizer's ``eps`` (it was 0 or nearly)."""

    def restore_state(self) -> dict[str, Any]:
        """Put back state a bad batch poisoned (BatchNorm statistics, metrics); what was put
        back, for the run log."""


class DecayBackend(Protocol):
    """What a backend that can set the optimizer's weight decay adds (torch): asked by
    :func:`_decay` (by name: a backend without it backs the learning rate off instead)."""

    def weight_decay_settable(self) -> bool:
        """Does the failing step's optimizer have a weight decay to set?"""

    def set_weight_decay(self, weight_decay: float) -> None:
        """Lower the optimizer's weight decay to ``weight_decay`` (from now on)."""


def _print_warning(w: EarlyWarning) -> None:
    """An early warning, on stderr (a healthy script's stdout and exit status stay its own)."""
    say(w.line())


def clip_suggestion(history: History) -> float | None:
    """A clipping threshold from the calm part of the history (``None`` without norms)."""
    from .diagnosis import _clip_threshold

    return _clip_threshold(history) if history.series("grad_norm", 200) else None


@dataclass
class StepController:
    """The state machine of a guarded run's steps, shared by every framework.

    Attributes:
        config: the policy and its limits, as asked for (frozen).
        state: the counters, the back-off in force and what was done (``state_dict`` saves it).
        history: per-step scalars (the evidence the diagnosis reads).
        findings: every non-finite event, ``(Finding, Diagnosis)``, in order.
        raised: findings this guard raised as errors — one the script caught and went on from
            is reported at the end all the same (:meth:`swallowed`).
    """

    config: RecoveryConfig
    history: History
    state: RecoveryState = field(default_factory=RecoveryState)
    findings: list[tuple[Finding, Diagnosis]] = field(default_factory=list)
    raised: list[tuple[Finding, Diagnosis | None, int]] = field(default_factory=list)
    scaler_skips: int = 0
    steps_after_raise: int = 0
    judge: OutcomeJudge = field(default_factory=OutcomeJudge)
    early: EarlyWarnings = field(default_factory=lambda: EarlyWarnings(_print_warning))
    max_escalations: int = 2
    escalations: int = 0
    _backend: Backend | None = field(default=None, repr=False)
    _drops: list[tuple[int, str]] = field(default_factory=list, repr=False)
    _forced_drops: int = field(default=0, repr=False)
    #: when the back-off in force grows back (``recover``)
    regrowth: Regrowth = field(default_factory=Regrowth)
    _scale_seen: float = field(default=1.0, repr=False)
    #: the steps a recovery is judged on (with several optimizers, the primary's)
    primary: PrimarySteps = field(default_factory=PrimarySteps)

    # --- events ------------------------------------------------------------------------------------
    def healthy(self) -> None:
        """The step's check passed (called once per healthy step, before its update)."""
        self.state = self.state.healthy()

    def step_ended(self) -> None:
        """Any step ended (healthy or not), after its history record: a step that follows a
        raised error means the script caught it and went on; after a recovery, the step is
        evidence for its outcome — and a recovery that did not bring the run back is escalated
        (``recover``) before the run is said not to have come back."""
        if self.raised:
            self.steps_after_raise += 1
        if len(self.history):
            self.early.observe(self.history)
            self.primary.note(self.history[-1])
        if self.judge.judging and len(self.history) and self.primary.owns(self.history[-1]):
            decided = self.judge.observe(self.history[-1])
            if decided is not None and decided.status == "not-recovered":
                self._escalate()
        self._grow_back()

    def snapshot_wanted(self) -> bool:
        """Asked by the adapter before its own snapshot rule, at each snapshot opportunity of
        a healthy step: a raise of the back-off began, take one now whatever the interval
        (asked once: it is then forgotten)."""
        wanted, self.regrowth.wants_snapshot = self.regrowth.wants_snapshot, False
        return wanted

    def _judged(self, n: int = 4 * LEVEL_STEPS) -> History:
        return self.primary.of(self.history, n)


    def _grow_back(self) -> None:
        """Under ``recover``, with a back-off in force: raise it toward 1 after a run of healthy
        steps, undo a raise the loss did not bear (:class:`~nanguard.core.growth.Regrowth`)."""
        scale = self.state.lr_scale
        if scale != self._scale_seen:  # an action (or a resumed state) changed it
            self._scale_seen = scale
            if len(self.history):
                self.regrowth.backed_off(self.history[-1].step)
        if self.config.policy != "recover" or (scale >= 1.0 and self.regrowth.probation is None
                                               and self.regrowth.reference is None):
            return
        change = self.regrowth.step_ended(self._judged(2 * self.regrowth.every + 4 * LEVEL_STEPS), scale,
                                          self.judge.judging, self.primary.start(self.history))
        if change is None or self._backend is None:
            return
        new, why = change
        step = self.history[-1].step
        if new > scale:
            self.regrowth.wants_snapshot = True  # the state the raise is tried from
        elif self.regrowth.damaged == "relapse":
            # the newest snapshot may hold the start of the climb: the one before it
            restored = self._backend.rollback(older=True)
            if restored is not None:
                why += f"; rolled back to step {restored}"
        elif self.regrowth.damaged in ("nonfinite", "rose") or (
                self.regrowth.damaged == "jump" and self.primary.above_start(self.history)):
            # the raise diverged the weights: back to the snapshot taken as it began (none
            # other is taken while a raise is on probation)
            restored = self._backend.rollback()
            if restored is not None:
                why += f"; rolled back to step {restored}"
        self.state = self.state.regrown(step, new, why)
        self._scale_seen = new
        self._backend.settings_changed()
        say(f"nanguard: step {step}: learning-rate back-off ×{scale:.3g} → ×{new:.3g} ({why})")

    def snapshot_ok(self) -> bool:
        """May a snapshot be kept now as "last known good"? (The adapters ask before taking
        one after a healthy step: see :func:`~nanguard.core.outcome.healthy_now`.)"""
        # nor while a raised learning rate is on probation: an undo goes back to before it
        judged = self._judged()
        newest = judged[-1].loss if len(judged) else None
        return (self.regrowth.probation is None and not self.regrowth.off_level(newest)
                and healthy_now(judged, self.judge))

    def run_ended(self, step: int) -> dict[str, Any] | None:
        """The run ended: decide an open episode; the run's outcome (``None``: nothing was
        ever done about a non-finite step)."""
        self.judge.ended(step, self._judged().series("loss", LEVEL_STEPS))
        v = self.judge.verdict()
        if v is None:
            return None
        out = v.to_dict()
        if self.state.lr_changes:  # the back-off grew back: the factor in force at the end
            out.update(lr_scale=self.state.lr_scale, lr_changes=[dict(c) for c in self.state.lr_changes])
        return out

    def _escalate(self) -> None:
        """The last recovery did not bring the run back: under ``recover``, for a cause a
        back-off can fix, roll back further with a back-off measured on the run as it is now."""
        cur = self.judge.current
        backend = self._backend
        if (cur is None or backend is None or self.config.policy != "recover"
                or self.escalations >= self.max_escalations or not self.findings
                or self.findings[-1][1].cause not in ROLLBACK):
            return
        self.escalations += 1
        factor = lr_candidates(cur.ratio_now, cap=0.1)[0]
        restored = backend.rollback(older=True)
        step = self.history[-1].step
        self.state = self.state.applied(factor, None)
        backend.settings_changed()
        action = Action("rollback", "escalated: the last recovery did not bring the run back", lr_factor=factor)
        details: dict[str, Any] = {"cause": self.findings[-1][1].cause.value, "escalation": self.escalations,
                                   "outcome": cur.to_dict(), "verified": None}
        if restored is not None:
            details.update(restored_step=restored, steps_lost=step + 1 - restored)
        self.state = self.state.recorded(step, action, **details)
        self._said()
        self.judge.acted(step, self._judged())

    def scaler_stepped(self) -> None:
        """The dynamic loss scaler applied the update: its run of skips is over."""
        self.scaler_skips = 0

    def scaler_skipped(self, *, nan_loss: bool, scale: float | None) -> str | None:
        """The loss scaler skipped the update. ``None``: that is its own business (the scaled
        gradients overflowed; it lowers the scale) — never a finding, also before the first
        update. Otherwise the reason it is a failure (the loss itself is NaN, or the scale ran
        out of room)."""
        self.scaler_skips += 1
        if nan_loss:
            self.scaler_skips = 0
            return "the loss itself is not finite: no loss scale can fix it"
        known = scale if scale is not None and math.isfinite(scale) else None
        if not loss_scale_gave_up(known, self.scaler_skips, self.config.max_consecutive_skips):
            return None
        n, self.scaler_skips = self.scaler_skips, 0
        where = f" (scale {scale:.3g})" if scale is not None and math.isfinite(scale) else ""
        return f"the loss scaler skipped {n} steps in a row{where}: the gradients overflow even unscaled"

    # --- the decision ------------------------------------------------------------------------------
    def act(
        self,
        finding: Finding,
        diag: Diagnosis,
        backend: Backend,
        *,
        step: int,
        eps: float | None = None,
        after_update: bool = False,
        rollback_weights: bool = False,
        script_clip: float | None = None,
        adaptive: bool = False,
    ) -> Action:
        """Decide about a non-finite step and have ``backend`` carry it out.

        Called before the update (the check of loss and gradients failed), or right after it
        (``after_update``: the update made the weights non-finite: it must be rolled back).
        Raises :class:`NonFiniteError` (policy ``raise``, or a cause with no blind fix) or
        :class:`GiveUpError` (limits reached; an applied bad update with no snapshot)."""
        self.findings.append((finding, diag))
        self.early.close()  # warnings come before the first NaN or not at all
        if finding.details.get("origin") == "carried" and self.config.policy != "raise":
            # no batch to drop and no snapshot holds it: stop with the run's first event
            self._give_up(finding, diag, step, after_update, backend,
                          "the non-finite value is in state the script carries across steps (the "
                          "model returned it and the script passed it back in): neither dropping "
                          "the batch nor a rollback resets it")
        self._backend = backend
        self._repeated_drops(finding, diag, step, after_update, backend)
        ratio, clip = _agreed(backend, self.history.update_ratio_estimate(), self._clip(script_clip, adaptive))
        action, self.state = decide(self.config, self.state, diag, step, clip, eps, ratio, _decay(diag, backend))
        if action.kind == "raise":
            self._raise(NonFiniteError(finding, diag), step)
        if action.kind == "give_up":
            self._give_up(finding, diag, step, after_update, backend, action.reason)
        details: dict[str, Any] = {"cause": diag.cause.value}
        if finding.rank is not None:
            details["rank"] = finding.rank
        if action.kind == "drop_batch":
            samples = finding.details.get("samples") or []
            details["samples"] = [s.get("index") for s in samples]
            details["input"] = finding.details.get("input_name") or finding.source
        if action.kind == "rollback":
            action, trials = self._verified(action, ratio, finding, diag, backend, step, after_update)
            details["verified"] = None if trials is None else action.kind == "rollback"
            if trials is not None:
                details["trials"] = [dict(t) for t in diag.trials]
        if action.kind == "rollback" or after_update or rollback_weights:
            details.update(self._rollback(finding, diag, backend, step, after_update))
        if action.set_eps is not None:
            backend.set_eps(action.set_eps)
        if action.set_weight_decay is not None:
            cast(DecayBackend, backend).set_weight_decay(action.set_weight_decay)
        details.update(backend.restore_state())
        self.state = self.state.recorded(step, action, **details)
        self._said()
        self.judge.acted(step, self.primary.up_to(self.history, details.get("restored_step"), 4 * LEVEL_STEPS),
                         bad_batch=action.kind == "drop_batch" or diag.cause is Cause.NONFINITE_INPUT)
        if not after_update:
            backend.skip_update()
        return action

    def _clip(self, script_clip: float | None, adaptive: bool) -> float | None:
        """A clipping threshold to try, from the calm part of the history — none where clipping
        cannot shrink the step (an adaptive optimizer) or repeats the script's own clip."""
        clip = clip_suggestion(self.history)
        if clip is not None and (adaptive or (script_clip is not None and script_clip <= clip)):
            return None
        return clip

    def advice_trials(self, diag: Diagnosis, backend: Backend, *, step: int, eps: float | None = None,
                      script_clip: float | None = None, adaptive: bool = False) -> list[Trial] | None:
        """Policy ``raise``, after the diagnosis and before the finding is raised: the fixes
        ``recover`` would try (the same pure decision, the same candidates), tried on the failing
        step from the newest snapshot — nothing is applied and the run is left as it failed. The
        advice then says which worked (:mod:`nanguard.core.rules.fixes`). ``None``: the cause has
        no fix to try, or the step cannot be re-run (no snapshot: the advice stays untried)."""
        if diag.cause is Cause.UNSCALED_DATA:  # its second fix is a learning rate: tried as one
            diag = replace(diag, cause=Cause.LEARNING_RATE_TOO_HIGH)
        if diag.cause not in ROLLBACK:
            return None
        ratio, clip = _agreed(backend, self.history.update_ratio_estimate(), self._clip(script_clip, adaptive))
        action, _ = decide(replace(self.config, policy="recover"), self.state, diag, step, clip, eps, ratio,
                           _decay(diag, backend))
        if action.kind != "rollback":
            return None
        return backend.trial(_candidates(action, ratio, self.config.lr_factor))

    def _said(self) -> None:
        """One line on stderr as the policy acts (:func:`~nanguard.core.render.event_line`)."""
        recs = self.state.recoveries
        line = event_line(recs[-1], len(recs))
        if line is not None:
            say(line)

    def _repeated_drops(self, finding: Finding, diag: Diagnosis, step: int, after_update: bool,
                        backend: Backend, force: bool = False) -> None:
        """``recover`` drops a batch with NaN/Inf — but not hundreds of them from one source:
        after :data:`MAX_REPEATED_DROPS` from the same line, half or more of the steps since the
        first of them, it stops with the diagnosis (dropping cannot fix a value the script
        computes, nor a data file that is mostly bad)."""
        if (diag.cause is not Cause.NONFINITE_INPUT and not force) or self.config.policy != "recover":
            return
        src = str(finding.source or finding.details.get("input_name") or "?")
        self._drops = [(s, x) for s, x in self._drops if step - s < DROP_WINDOW]
        self._drops.append((step, src))
        same = [s for s, x in self._drops if x == src]
        if len(same) >= MAX_REPEATED_DROPS and 2 * len(same) >= step - same[0] + 1:
            where = f" entering at {src}" if src != "?" else ""
            if finding.details.get("origin") in ("computed", "unrecorded"):
                where = f" made by the script at {src}"
            what = ("failed at the healthy weights whatever the fix" + (f" (at {src})" if src != "?" else "")
                    if force else f"held non-finite values{where}")
            self._give_up(finding, diag, step, after_update, backend,
                          f"{len(same)} of the last {step - same[0] + 1} steps {what}: "
                          "dropping batches cannot fix a source that keeps making them — if the script "
                          "computes this tensor (returns, targets, a state), fix that computation; if it "
                          "loads it, clean the data (nanguard scan FILE)")

    def _verified(self, action: Action, ratio: float | None, finding: Finding, diag: Diagnosis,
                  backend: Backend, step: int, after_update: bool) -> tuple[Action, list[Trial] | None]:
        """Try the action's fix and smaller learning rates (see :mod:`nanguard.core.trials`);
        the first verified one is applied. No verified fix: stop with what was tried."""
        fixes = _candidates(action, ratio, self.config.lr_factor)
        trials = backend.trial(fixes)  # each applies its own fix on top of the back-off in force
        if trials is None:
            self.state = self.state.applied(action.lr_factor, action.clip_norm)
            return action, None
        diag.trials = [t.to_dict() for t in trials]
        if any(t.fix.lr_factor is not None for t in trials):
            # the trials decide the learning rate: a suggested one they did not verify goes
            diag.fixes[:] = [f for f in diag.fixes if "lr=" not in f and "learning_rate=" not in f]
        hint = _inputs_hint(trials, self.history)
        if hint:  # a loss a hundred times its healthy level at the healthy weights verifies nothing
            for t in diag.trials:
                t.update(verified=False, note="the loss at the healthy weights is far above its healthy level")
        good = None if hint else next((t for t in trials if t.verified), None)
        if good is None:
            tried = "; ".join(t.describe() for t in trials)
            if hint or all(t.fails_at_start for t in trials):
                # it fails at the healthy weights whatever the update: the batch (or a state
                # the script passed in) is what is wrong — skip it, as a bad batch is dropped
                self._repeated_drops(finding, diag, step, after_update, backend, force=True)
                self._forced_drops += 1
                if self._forced_drops > MAX_FORCED_DROPS:
                    self._give_up(finding, diag, step, after_update, backend,
                                  f"{self._forced_drops} steps of this run failed at the healthy weights whatever "
                                  f"the fix ({diag.cause.value}): dropping their batches does not cure a cause of "
                                  "the update, and the run is not coming back")
                return Action("drop_batch", f"the step fails at the healthy weights of step "
                              f"{trials[0].from_step} with every fix tried ({tried}){hint}: skipped "
                              "its batch"), trials
            self._give_up(finding, diag, step, after_update, backend,
                          f"no fix tried on the failing step made it finite with its loss going down ({tried})")
        assert good is not None
        if good.lr is not None and good.fix.lr_factor is not None:
            losses = " → ".join(f"{v:.4g}" for v in good.losses)
            diag.fixes.insert(0, f"lr = {good.lr:.2g}  # verified on the failing step's batch from the "
                                 f"snapshot of step {good.from_step}: loss {losses}")
        fix = good.fix
        chosen = Action("rollback", action.reason, lr_factor=fix.lr_factor, clip_norm=fix.clip_norm,
                        set_eps=fix.eps, set_weight_decay=fix.weight_decay)
        self.state = self.state.applied(fix.lr_factor, fix.clip_norm)
        return chosen, trials

    def _give_up(self, finding: Finding, diag: Diagnosis, step: int, after_update: bool,
                 backend: Backend, reason: str) -> None:
        """Stop: the error leads with the first event of the run (where it all began), the
        attempts list every event and what was done about it."""
        if after_update:  # stop with the weights as they were before the bad update
            backend.rollback()
        self.state = self.state.recorded(step, Action("give_up", reason), cause=diag.cause.value)
        first_f, first_d = self.findings[0]
        err = GiveUpError(first_f, first_d, reason=reason, attempts=self.state.attempts())
        err.last = (finding, diag)
        self._raise(err, step)

    def _rollback(self, finding: Finding, diag: Diagnosis, backend: Backend, step: int,
                  after_update: bool) -> dict[str, Any]:
        restored = backend.rollback()
        if restored is not None:
            return {"restored_step": restored, "steps_lost": step - restored}
        if after_update:
            # the bad update is applied and nothing can undo it: going on would break the
            # guarantee that no non-finite update reaches the weights
            self._give_up(finding, diag, step, False, backend, "the update made the weights "
                          "non-finite and there is no snapshot to roll back to")
        return {"restored_step": None, "note": "no snapshot yet: the update was skipped instead"}

    def _raise(self, err: NonFiniteError, step: int) -> None:
        self.raised.append((err.finding, err.diagnosis, step))
        self.steps_after_raise = 0
        raise err

    # --- what the script did with an error -------------------------------------------------------
    def swallowed(self) -> tuple[Finding, Diagnosis | None, int] | None:
        """The first error this guard raised, when the script caught it and training went on
        (a ``try: ... except Exception: continue`` around the step); ``None`` otherwise."""
        if self.raised and self.steps_after_raise > 0:
            return self.raised[0]
        return None

    # --- resuming -------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to keep what the guard learned (plain Python values, safe to
        ``torch.save`` with ``weights_only=True`` or to write as JSON)."""
        return {
            "version": 1,
            "policy": self.config.policy,
            **self.state.to_dict(),
            "scaler_skips": self.scaler_skips,
            "history": self.history.summary(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s values (the policy itself stays the one asked for now)."""
        if not isinstance(state, dict) or state.get("version") != 1:
            raise ValueError(
                "load_state_dict: not a nanguard guard state (expected the dict that "
                "guard.state_dict() returned, version 1)"
            )
        self.state = RecoveryState.from_dict(state)
        self.scaler_skips = int(state.get("scaler_skips", 0))
        if state.get("policy") not in (None, self.config.policy):
            log.info("nanguard: resumed a %s guard's state under policy %r", state.get("policy"),
                     self.config.policy)


def _agreed(backend: Backend, ratio: float | None, clip: float | None) -> tuple[float | None, float | None]:
    """The update/weight ratio and the clipping threshold every rank decides with: the largest
    ratio (the strongest back-off) and the tightest threshold any rank measured."""
    seen = backend.across_ranks((ratio, clip))
    ratios = [r for r, _ in seen if r is not None]
    clips = [c for _, c in seen if c is not None]
    return (max(ratios) if ratios else None), (min(clips) if clips else None)


def _candidates(action: Action, ratio: float | None, cap: float) -> list[Fix]:
    """The fixes to try for a rollback, least drastic first: the policy's own, then with a
    learning rate ten and a hundred times lower (or, for a clip or ``eps`` alone, with the
    measured back-off added)."""
    clip, eps = action.clip_norm, action.set_eps
    if action.set_weight_decay is not None:  # the decay first, then with the learning rate too
        wd = action.set_weight_decay
        return [Fix(weight_decay=wd), *(Fix(x, weight_decay=wd) for x in _smaller(cap)[:2])]
    if action.lr_factor is not None:
        return [Fix(x, clip, eps) for x in _smaller(action.lr_factor)]
    lr = lr_candidates(ratio, cap)
    if clip is None and eps is None:
        return [Fix(x) for x in lr]
    return [Fix(None, clip, eps), Fix(lr[0], clip, eps), Fix(lr[1], clip, eps)]


def _decay(diag: Diagnosis, backend: Backend) -> float | None:
    """The weight decay to set instead of a learning-rate back-off, where the diagnosis sized one
    and the backend can set it (torch; a Keras optimizer's decay is traced into its step)."""
    settable = getattr(backend, "weight_decay_settable", None)
    return diag.weight_decay if diag.weight_decay is not None and settable is not None and settable() else None


def _inputs_hint(trials: list[Trial], history: History) -> str:
    """When the loss at the restored healthy weights is already far off on the failing batch,
    the weights are not what is wrong: say so."""
    first = next((t.losses[0] for t in trials if t.losses), None)
    level = Level.of(history)
    if first is None or level.ceiling is None or not (not math.isfinite(first) or first > 100 * abs(level.ceiling)):
        return ""
    return (f"; at the restored weights the loss on this batch is already {first:.3g} (healthy ≈ "
            f"{level.loss:.3g}): what is wrong is in the step's inputs (the batch, or state the "
            "script carries across steps: a hidden state it passes back in), not in the weights")


def _smaller(f: float) -> list[float]:
    """``f``, then 10× and 100× smaller, then by 100× at a time down to 1e-10: an update/weight
    ratio read after an update that swamped the weights is about 1 whatever the excess, so a
    learning rate 10⁸× too high is found by trying, not by the estimate."""
    out = [f, f / 10, f / 100]
    while out[-1] / 100 >= 1e-10 and len(out) < 6:
        out.append(out[-1] / 100)
    return [float(f"{x:.2g}") for x in out]
