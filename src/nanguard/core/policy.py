"""Recovery policies as an observable state machine (framework-free).

The adapter calls :meth:`Recovery.decide` once per non-finite step, after the diagnosis; the
returned :class:`Action` says what to do, and the counters on the object say what was done so far
(``notfinite_count``, ``total_notfinite``, ``recoveries`` — as optax's ``apply_if_finite``
exposes them). The adapter carries the action out with its framework's machinery and calls
:meth:`Recovery.healthy_step` for every good step.

Policies:

* ``raise`` — stop at the first non-finite value (the finding is the error).
* ``skip`` — never apply that update; give up after ``max_consecutive_skips`` in a row.
* ``recover`` — act on the cause: drop a poisoned batch (``nonfinite-input``); roll back to the
  last good snapshot and back off the learning rate and/or switch on clipping
  (``learning-rate-too-high``, ``exploding-gradients``, ``optimizer-state``); stop with the
  diagnosis where no blind fix exists (``unsafe-op``, ``bad-initialization``,
  ``nonfinite-parameters``, ``low-precision-overflow``) — or skip those too with
  ``on_unfixable="skip"``. At most ``max_recoveries`` rollbacks within ``window`` steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .config import POLICIES
from .diagnosis import Diagnosis
from .taxonomy import Cause
from .trials import changes, lr_candidates

__all__ = ["ROLLBACK", "UNFIXABLE", "Action", "Recovery", "RecoveryCounters", "loss_scale_gave_up"]

ROLLBACK = _ROLLBACK = {Cause.LEARNING_RATE_TOO_HIGH, Cause.EXPLODING_GRADIENTS, Cause.OPTIMIZER_STATE}
UNFIXABLE = _UNFIXABLE = {
    Cause.UNSAFE_OP,
    Cause.BAD_INITIALIZATION,
    Cause.NONFINITE_PARAMETERS,
    Cause.LOW_PRECISION_OVERFLOW,
}


@dataclass(frozen=True)
class Action:
    """What the adapter must do about one non-finite step.

    ``kind``: ``"raise"`` (stop with the finding), ``"give_up"`` (stop: limits reached),
    ``"skip"`` (do not apply the update), ``"drop_batch"`` (skip, and log the bad samples),
    ``"rollback"`` (restore the last snapshot, skip the update, then apply ``lr_factor`` /
    ``clip_norm`` from now on). ``lr_factor`` multiplies the learning rate *in addition to* any
    earlier back-off; ``clip_norm`` is the new clipping threshold (``None``: unchanged).
    """

    kind: str
    reason: str
    lr_factor: float | None = None
    clip_norm: float | None = None
    set_eps: float | None = None

    def describe(self) -> str:
        return " + ".join([self.kind.replace("_", " "), *changes(self.lr_factor, self.clip_norm, self.set_eps)])


@dataclass
class Recovery:
    """The policy and its counters. One per guarded run."""

    policy: str = "raise"
    max_consecutive_skips: int = 10
    lr_factor: float = 0.5
    max_recoveries: int = 5
    window: int = 1000
    on_unfixable: str = "raise"
    notfinite_count: int = 0
    total_notfinite: int = 0
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    lr_scale: float = 1.0
    clip_norm: float | None = None

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy={self.policy!r}: valid policies are {', '.join(POLICIES)}.")
        if self.max_consecutive_skips < 1:
            raise ValueError("max_consecutive_skips must be >= 1")
        if not 0.0 < self.lr_factor < 1.0:
            raise ValueError(f"lr_factor must be in (0, 1), got {self.lr_factor}")
        if self.max_recoveries < 1 or self.window < 1:
            raise ValueError("max_recoveries and window must be >= 1")
        if self.on_unfixable not in ("raise", "skip"):
            raise ValueError("on_unfixable must be 'raise' or 'skip'")

    # --- the decision ----------------------------------------------------------------------------
    def decide(
        self,
        diagnosis: Diagnosis,
        step: int,
        clip_suggestion: float | None = None,
        eps: float | None = None,
        update_ratio: float | None = None,
    ) -> Action:
        """What to do about a non-finite step whose cause is ``diagnosis.cause``.

        ``update_ratio`` (median ``|Δw|/|w|`` of the healthy steps) sizes the learning-rate
        back-off: ×``lr_factor`` normally, more when the updates were far larger than the ≈1e-3
        of healthy training — halving a learning rate 10⁵× too high five times over would
        exhaust the recoveries before it helped (:meth:`backoff`).
        """
        if self.policy == "raise":
            return Action("raise", "policy 'raise'")
        cause = diagnosis.cause
        if self.policy == "skip" or (cause in _UNFIXABLE and self.on_unfixable == "skip"):
            return self._skip(step, "policy 'skip'" if self.policy == "skip" else
                              f"{cause.value}: no blind fix; skipping as asked")
        if cause is Cause.NONFINITE_INPUT:
            return self._skip(step, "the batch holds NaN/Inf: dropped it", kind="drop_batch")
        if cause in _UNFIXABLE:
            return Action("raise", f"{cause.value} cannot be fixed blindly")
        if cause not in _ROLLBACK:  # a cause with no rule of its own is never rolled back blindly
            return Action("raise", f"{cause.value}: no recovery rule")
        # roll back: learning rate, exploding gradients, optimizer state
        recent = [r for r in self.recoveries if r.get("action") == "rollback" and step - r["step"] < self.window]
        if len(recent) >= self.max_recoveries:
            return Action(
                "give_up",
                f"{len(recent)} rollbacks within {self.window} steps did not stop the non-finite values",
            )
        lr = None
        clip = None
        set_eps = None
        if cause is Cause.OPTIMIZER_STATE and eps is not None and eps < 1e-12:
            set_eps = 1e-8
        elif cause is Cause.EXPLODING_GRADIENTS:
            clip = clip_suggestion if self.clip_norm is None else self.clip_norm * 0.5
            if recent or clip is None:
                # no clip to switch on (an adaptive optimizer, or the script clips tighter
                # already): the learning rate is what can shrink the step
                lr = self.lr_factor if clip is not None else self.backoff(update_ratio)
        else:
            lr = self.backoff(update_ratio)
            if recent and clip_suggestion is not None:
                clip = clip_suggestion if self.clip_norm is None else self.clip_norm * 0.5
        act = Action("rollback", f"{cause.value}", lr_factor=lr, clip_norm=clip, set_eps=set_eps)
        self.total_notfinite += 1
        self.notfinite_count += 1
        if lr is not None:
            self.lr_scale *= lr
        if clip is not None:
            self.clip_norm = clip
        return act

    def backoff(self, update_ratio: float | None) -> float:
        """The learning-rate factor for one rollback (see :meth:`decide`): ×``lr_factor`` while
        the updates were of a healthy size, else the factor that brings the measured update/
        weight ratio to about 1e-3 (a learning rate 10⁵× too high gets ×1e-5, not ×0.5)."""
        if update_ratio is None or update_ratio <= 0.02:
            return self.lr_factor
        return lr_candidates(update_ratio, self.lr_factor)[0]

    def _skip(self, step: int, reason: str, kind: str = "skip") -> Action:
        self.notfinite_count += 1
        self.total_notfinite += 1
        if self.notfinite_count >= self.max_consecutive_skips:
            return Action("give_up", f"{self.notfinite_count} consecutive steps had non-finite values")
        return Action(kind, reason)

    def healthy_step(self) -> None:
        """A good step: the consecutive count starts over."""
        self.notfinite_count = 0

    def record(self, step: int, action: Action, **details: Any) -> dict[str, Any]:
        """Log what was done (the run log's ``recoveries``)."""
        entry = {"step": step, "action": action.kind, "reason": action.reason,
                 "description": action.describe(), **details}
        if action.lr_factor is not None:
            entry["lr_factor"] = action.lr_factor
            entry["lr_scale"] = self.lr_scale
        if action.clip_norm is not None:
            entry["clip_norm"] = action.clip_norm
        if action.set_eps is not None:
            entry["eps"] = action.set_eps
        self.recoveries.append(entry)
        return entry

    def attempts(self) -> list[str]:
        """Every event and what was done about it: ``step 4: drop batch (nonfinite-input)``."""
        return [f"step {r['step']}: {r['description']}" + (f" ({r['cause']})" if r.get("cause") else "")
                for r in self.recoveries]


class RecoveryCounters:
    """The counters of a guard, under the names optax's ``apply_if_finite`` and accelerate use,
    for any object that keeps its policy's :class:`Recovery` as ``self.recovery``."""

    recovery: Recovery

    @property
    def notfinite_count(self) -> int:
        """Consecutive non-finite steps so far (reset by a healthy step)."""
        return self.recovery.notfinite_count

    @property
    def total_notfinite(self) -> int:
        """All non-finite steps of the run (skipped, dropped or rolled back)."""
        return self.recovery.total_notfinite

    @property
    def recoveries(self) -> list[dict[str, Any]]:
        """What the policy did, one entry per action (the run log's ``recoveries``)."""
        return self.recovery.recoveries


#: a loss scaler that keeps skipping is given up on after this many skips in a row, whatever
#: its scale (from 2**16, 64 halvings reach 2**-48: nothing in float16 is that small)
MAX_SCALER_SKIPS = 64


def loss_scale_gave_up(scale: float | None, skips: int, max_skips: int) -> bool:
    """After a dynamic loss scaler (``torch.amp.GradScaler``, Keras' ``LossScaleOptimizer``)
    skipped ``skips`` steps in a row: has it run out of room? While its ``scale`` is above 1 it
    can still halve its way under the overflow (from the default 2**15 or 2**16 that takes up to
    16 skips), which is its own business, not a failure. At or below 1 the unscaled float16
    values themselves overflow. ``scale=None`` (unreadable): ``max_skips`` in a row."""
    if skips >= MAX_SCALER_SKIPS:
        return True
    if scale is None or scale != scale:  # unknown or NaN
        return skips >= max_skips
    return scale <= 1.0
