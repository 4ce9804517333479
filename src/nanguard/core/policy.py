"""Recovery policies: a configuration, a small state, and a pure decision (framework-free).

As optax's ``apply_if_finite``: what the user asked for (:class:`RecoveryConfig`, frozen,
validated once) is kept apart from what the run has been through (:class:`RecoveryState`, frozen:
the counters ``notfinite_count`` / ``total_notfinite``, the learning-rate factor and clipping
threshold in force, the log of ``recoveries``). :func:`decide` is pure::

    action, state = decide(config, state, diagnosis, step, ...)

The step controller (:mod:`nanguard.core.controller`) calls it once per non-finite step, after
the diagnosis, keeps the new state, and applies the action's back-off to it only once the action
is carried out (:meth:`RecoveryState.applied`: a fix that trials rejected is never applied).

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

from dataclasses import dataclass, field, replace
from typing import Any

from .config import POLICIES
from .diagnosis import Diagnosis
from .taxonomy import Cause
from .trials import changes, lr_candidates

__all__ = [
    "ROLLBACK", "UNFIXABLE", "Action", "RecoveryConfig", "RecoveryState", "backoff", "check_policy",
    "decide", "loss_scale_gave_up",
]

ROLLBACK = {Cause.LEARNING_RATE_TOO_HIGH, Cause.EXPLODING_GRADIENTS, Cause.OPTIMIZER_STATE}
UNFIXABLE = {
    Cause.UNSAFE_OP,
    Cause.BAD_INITIALIZATION,
    Cause.NONFINITE_PARAMETERS,
    Cause.LOW_PRECISION_OVERFLOW,
    Cause.UNSCALED_DATA,
}


def check_policy(policy: str, where: str = "policy", extra: tuple[str, ...] = ()) -> str:
    """``policy`` if it is one of :data:`~nanguard.core.config.POLICIES` (or of ``extra``, a
    trainer callback's own modes); else a ``ValueError`` that names the call (``where``, e.g.
    ``nanguard.attach(policy=...)``) and the valid values. Every guard validates here."""
    valid = (*POLICIES, *extra)
    if policy not in valid:
        raise ValueError(f"{where}: policy={policy!r} is not a policy; valid policies are {', '.join(valid)}.")
    return policy


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
    set_weight_decay: float | None = None

    def describe(self) -> str:
        return " + ".join([self.kind.replace("_", " "), *changes(self.lr_factor, self.clip_norm, self.set_eps,
                                                                  weight_decay=self.set_weight_decay)])


@dataclass(frozen=True)
class RecoveryConfig:
    """What the user asked for: the policy and its limits. Validated once, never changed by a
    run (a script's own ``attach()`` under ``nanguard run`` replaces it, keeping the state)."""

    policy: str = "raise"
    max_consecutive_skips: int = 10
    lr_factor: float = 0.5
    max_recoveries: int = 5
    window: int = 1000
    on_unfixable: str = "raise"

    def __post_init__(self) -> None:
        check_policy(self.policy)
        if self.max_consecutive_skips < 1:
            raise ValueError("max_consecutive_skips must be >= 1")
        if not 0.0 < self.lr_factor < 1.0:
            raise ValueError(f"lr_factor must be in (0, 1), got {self.lr_factor}")
        if self.max_recoveries < 1 or self.window < 1:
            raise ValueError("max_recoveries and window must be >= 1")
        if self.on_unfixable not in ("raise", "skip"):
            raise ValueError("on_unfixable must be 'raise' or 'skip'")


@dataclass(frozen=True)
class RecoveryState:
    """What the run has been through (what ``state_dict`` saves): the counters under the names
    optax's ``apply_if_finite`` and accelerate use, the back-off in force, what was done."""

    notfinite_count: int = 0  # consecutive non-finite steps (a healthy step resets it)
    total_notfinite: int = 0  # all non-finite steps acted on (skipped, dropped, rolled back)
    lr_scale: float = 1.0  # the learning-rate factor applied at every step from now on
    clip_norm: float | None = None  # the clipping threshold switched on (None: none)
    recoveries: tuple[dict[str, Any], ...] = field(default=())
    #: the back-off growing back (:mod:`nanguard.core.growth`): ``{step, lr_scale, why}`` each
    lr_changes: tuple[dict[str, Any], ...] = field(default=())

    def healthy(self) -> RecoveryState:
        """A good step: the consecutive count starts over."""
        return self if not self.notfinite_count else replace(self, notfinite_count=0)

    def counted(self) -> RecoveryState:
        """One more non-finite step acted on."""
        return replace(self, notfinite_count=self.notfinite_count + 1, total_notfinite=self.total_notfinite + 1)

    def applied(self, lr_factor: float | None, clip_norm: float | None) -> RecoveryState:
        """A back-off carried out: the learning rate ×``lr_factor`` on top of the earlier ones,
        clipping at ``clip_norm`` (``None``: each unchanged)."""
        return replace(
            self,
            lr_scale=self.lr_scale * lr_factor if lr_factor is not None else self.lr_scale,
            clip_norm=clip_norm if clip_norm is not None else self.clip_norm,
        )

    def recorded(self, step: int, action: Action, **details: Any) -> RecoveryState:
        """What was done about ``step``, appended to :attr:`recoveries` (the run log's)."""
        entry = {"step": step, "action": action.kind, "reason": action.reason,
                 "description": action.describe(), **details}
        if action.lr_factor is not None:
            entry["lr_factor"] = action.lr_factor
            entry["lr_scale"] = self.lr_scale
        if action.clip_norm is not None:
            entry["clip_norm"] = action.clip_norm
        if action.set_eps is not None:
            entry["eps"] = action.set_eps
        if action.set_weight_decay is not None:
            entry["weight_decay"] = action.set_weight_decay
        return replace(self, recoveries=(*self.recoveries, entry))

    def regrown(self, step: int, lr_scale: float, why: str) -> RecoveryState:
        """The back-off changed by the growth rule (not by an action): ``lr_scale`` from now on."""
        entry = {"step": step, "lr_scale": lr_scale, "was": self.lr_scale, "why": why}
        return replace(self, lr_scale=lr_scale, lr_changes=(*self.lr_changes, entry))

    def attempts(self) -> list[str]:
        """Every event and what was done about it: ``step 4: drop batch (nonfinite-input)``."""
        return [f"step {r['step']}: {r['description']}" + (f" ({r['cause']})" if r.get("cause") else "")
                for r in self.recoveries]

    def to_dict(self) -> dict[str, Any]:
        return {"lr_scale": self.lr_scale, "clip_norm": self.clip_norm,
                "notfinite_count": self.notfinite_count, "total_notfinite": self.total_notfinite,
                "recoveries": [dict(x) for x in self.recoveries],
                "lr_changes": [dict(x) for x in self.lr_changes]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RecoveryState:
        clip = d.get("clip_norm")
        return cls(notfinite_count=int(d.get("notfinite_count", 0)),
                   total_notfinite=int(d.get("total_notfinite", 0)),
                   lr_scale=float(d.get("lr_scale", 1.0)), clip_norm=float(clip) if clip is not None else None,
                   recoveries=tuple(dict(x) for x in d.get("recoveries", [])),
                   lr_changes=tuple(dict(x) for x in d.get("lr_changes", [])))


def decide(
    config: RecoveryConfig,
    state: RecoveryState,
    diagnosis: Diagnosis,
    step: int,
    clip_suggestion: float | None = None,
    eps: float | None = None,
    update_ratio: float | None = None,
    weight_decay: float | None = None,
) -> tuple[Action, RecoveryState]:
    """What to do about a non-finite step whose cause is ``diagnosis.cause``, and the state
    with it counted. Pure: nothing is applied — the back-off the action carries joins the state
    when the controller carries the action out (:meth:`RecoveryState.applied`).

    ``update_ratio`` (median ``|Δw|/|w|`` of the healthy steps) sizes the learning-rate
    back-off: ×``lr_factor`` normally, more when the updates were far larger than the ≈1e-3
    of healthy training — halving a learning rate 10⁵× too high five times over would
    exhaust the recoveries before it helped (:func:`backoff`). ``weight_decay``: where the
    diagnosis found ``lr × weight_decay ≥ 1`` (and the backend can set it), the weight decay
    sized for the learning rate — the rollback sets it instead of backing the learning rate off
    (which would leave a decay that still shrinks the weights each step, and a run at chance).
    """
    if config.policy == "raise":
        return Action("raise", "policy 'raise'"), state
    cause = diagnosis.cause
    if config.policy == "skip" or (cause in UNFIXABLE and config.on_unfixable == "skip"):
        return _skip(config, state, "policy 'skip'" if config.policy == "skip" else
                     f"{cause.value}: no blind fix; skipping as asked")
    if cause is Cause.NONFINITE_INPUT:
        return _skip(config, state, "the batch holds NaN/Inf: dropped it", kind="drop_batch")
    if cause in UNFIXABLE:
        return Action("raise", f"{cause.value} cannot be fixed blindly"), state
    if cause not in ROLLBACK:  # a cause with no rule of its own is never rolled back blindly
        return Action("raise", f"{cause.value}: no recovery rule"), state
    # roll back: learning rate, exploding gradients, optimizer state
    recent = [r for r in state.recoveries if r.get("action") == "rollback" and step - r["step"] < config.window]
    if len(recent) >= config.max_recoveries:
        return Action("give_up", f"{len(recent)} rollbacks within {config.window} steps did not stop "
                      "the non-finite values"), state
    lr = clip = set_eps = None
    tighter = clip_suggestion if state.clip_norm is None else state.clip_norm * 0.5
    if weight_decay is not None and cause is Cause.LEARNING_RATE_TOO_HIGH and not recent:
        return (Action("rollback", f"{cause.value}", set_weight_decay=weight_decay), state.counted())
    if cause is Cause.OPTIMIZER_STATE and eps is not None and eps < 1e-12:
        set_eps = 1e-8
    elif cause is Cause.EXPLODING_GRADIENTS:
        clip = tighter
        if recent or clip is None:
            # no clip to switch on (an adaptive optimizer, or the script clips tighter
            # already): the learning rate is what can shrink the step
            lr = config.lr_factor if clip is not None else backoff(config, update_ratio)
    else:
        lr = backoff(config, update_ratio)
        if recent and clip_suggestion is not None:
            clip = tighter
    return Action("rollback", f"{cause.value}", lr_factor=lr, clip_norm=clip, set_eps=set_eps), state.counted()


def backoff(config: RecoveryConfig, update_ratio: float | None) -> float:
    """The learning-rate factor for one rollback (see :func:`decide`): ×``lr_factor`` while
    the updates were of a healthy size, else the factor that brings the measured update/
    weight ratio to about 1e-3 (a learning rate 10⁵× too high gets ×1e-5, not ×0.5)."""
    if update_ratio is None or update_ratio <= 0.02:
        return config.lr_factor
    return lr_candidates(update_ratio, config.lr_factor)[0]


def _skip(config: RecoveryConfig, state: RecoveryState, reason: str,
          kind: str = "skip") -> tuple[Action, RecoveryState]:
    state = state.counted()
    if state.notfinite_count >= config.max_consecutive_skips:
        return Action("give_up", f"{state.notfinite_count} consecutive steps had non-finite values"), state
    return Action(kind, reason), state


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
