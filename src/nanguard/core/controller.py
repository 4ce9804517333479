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
from dataclasses import dataclass, field
from typing import Any, Protocol

from .diagnosis import Diagnosis
from .errors import GiveUpError, NonFiniteError
from .finding import Finding
from .history import History
from .policy import Action, Recovery, loss_scale_gave_up

__all__ = ["Backend", "StepController", "clip_suggestion"]

log = logging.getLogger("nanguard")


class Backend(Protocol):
    """What a guard can do to its framework's run. Called by :meth:`StepController.act` only,
    after a non-finite step, in this order: ``rollback`` (if the action rolls back), ``set_eps``,
    ``restore_state``, ``skip_update`` (unless the update was already applied)."""

    def skip_update(self) -> None:
        """Make sure this step's update is never applied."""

    def rollback(self) -> int | None:
        """Restore the newest snapshot; return its step (``None``: there is none)."""

    def set_eps(self, eps: float) -> None:
        """Raise the optimizer's ``eps`` (it was 0 or nearly)."""

    def restore_state(self) -> dict[str, Any]:
        """Put back state a bad batch poisoned (BatchNorm statistics, metrics); what was put
        back, for the run log."""


def clip_suggestion(history: History) -> float | None:
    """A clipping threshold from the calm part of the history (``None`` without norms)."""
    from .diagnosis import _clip_threshold

    return _clip_threshold(history) if history.series("grad_norm", 200) else None


@dataclass
class StepController:
    """The state machine of a guarded run's steps, shared by every framework.

    Attributes:
        recovery: the policy and its counters (optax/accelerate names via ``RecoveryCounters``).
        history: per-step scalars (the evidence the diagnosis reads).
        findings: every non-finite event, ``(Finding, Diagnosis)``, in order.
        raised: findings this guard raised as errors — one the script caught and went on from
            is reported at the end all the same (:meth:`swallowed`).
    """

    recovery: Recovery
    history: History
    findings: list[tuple[Finding, Diagnosis]] = field(default_factory=list)
    raised: list[tuple[Finding, Diagnosis | None, int]] = field(default_factory=list)
    scaler_skips: int = 0
    steps_after_raise: int = 0

    # --- events ------------------------------------------------------------------------------------
    def healthy(self) -> None:
        """The step's check passed (called once per healthy step, before its update)."""
        self.recovery.healthy_step()

    def step_ended(self) -> None:
        """Any step ended (healthy or not): a step that follows a raised error means the script
        caught it and went on."""
        if self.raised:
            self.steps_after_raise += 1

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
        if not loss_scale_gave_up(known, self.scaler_skips, self.recovery.max_consecutive_skips):
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
    ) -> Action:
        """Decide about a non-finite step and have ``backend`` carry it out.

        Called before the update (the check of loss and gradients failed), or right after it
        (``after_update``: the update made the weights non-finite: it must be rolled back).
        Raises :class:`NonFiniteError` (policy ``raise``, or a cause with no blind fix) or
        :class:`GiveUpError` (limits reached; an applied bad update with no snapshot)."""
        self.findings.append((finding, diag))
        if finding.details.get("origin") == "carried" and self.recovery.policy != "raise":
            # no batch to drop and no snapshot holds it: stop with the run's first event
            self._give_up(finding, diag, step, after_update, backend,
                          "the non-finite value is in state the script carries across steps (the "
                          "model returned it and the script passed it back in): neither dropping "
                          "the batch nor a rollback resets it")
        action = self.recovery.decide(
            diag, step, clip_suggestion(self.history), eps, self.history.median_update_ratio()
        )
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
        if action.kind == "rollback" or after_update or rollback_weights:
            details.update(self._rollback(finding, diag, backend, step, after_update))
        if action.set_eps is not None:
            backend.set_eps(action.set_eps)
        details.update(backend.restore_state())
        self.recovery.record(step, action, **details)
        if not after_update:
            backend.skip_update()
        return action

    def _give_up(self, finding: Finding, diag: Diagnosis, step: int, after_update: bool,
                 backend: Backend, reason: str) -> None:
        """Stop: the error leads with the first event of the run (where it all began), the
        attempts list every event and what was done about it."""
        if after_update:  # stop with the weights as they were before the bad update
            backend.rollback()
        self.recovery.record(step, Action("give_up", reason), cause=diag.cause.value)
        first_f, first_d = self.findings[0]
        err = GiveUpError(first_f, first_d, reason=reason, attempts=self.recovery.attempts())
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
        r = self.recovery
        return {
            "version": 1,
            "policy": r.policy,
            "lr_scale": r.lr_scale,
            "clip_norm": r.clip_norm,
            "notfinite_count": r.notfinite_count,
            "total_notfinite": r.total_notfinite,
            "recoveries": [dict(x) for x in r.recoveries],
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
        r = self.recovery
        r.lr_scale = float(state.get("lr_scale", 1.0))
        clip = state.get("clip_norm")
        r.clip_norm = float(clip) if clip is not None else None
        r.notfinite_count = int(state.get("notfinite_count", 0))
        r.total_notfinite = int(state.get("total_notfinite", 0))
        r.recoveries[:] = [dict(x) for x in state.get("recoveries", [])]
        self.scaler_skips = int(state.get("scaler_skips", 0))
        if state.get("policy") not in (None, r.policy):
            log.info("nanguard: resumed a %s guard's state under policy %r", state.get("policy"), r.policy)
