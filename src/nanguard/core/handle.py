"""What every guard shares (framework-free): its options, validated once, and its public surface.

The torch :class:`~nanguard.torch.guard.Guard`, the Keras guard and the trainer callbacks are
each one :class:`GuardHandle` over one :class:`~nanguard.core.controller.StepController`, built
from one :class:`GuardOptions`: the counters (under optax's and accelerate's names), the history,
the findings, ``state_dict`` and ``report()`` are written here once.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, replace
from typing import Any, TextIO

from .controller import StepController
from .diagnosis import Diagnosis
from .finding import Finding
from .history import History
from .policy import RecoveryConfig, RecoveryState, check_policy
from .runlog import finished_status

__all__ = ["GuardHandle", "GuardOptions"]


@dataclass(frozen=True)
class GuardOptions:
    """A guard's options (the keyword arguments of ``nanguard.attach`` and the callbacks),
    validated when made: a bad value is an error at the call, not at the first NaN."""

    policy: str = "raise"
    replay: bool = True
    max_consecutive_skips: int = 10
    lr_factor: float = 0.5
    max_recoveries: int = 5
    recovery_window: int = 1000
    snapshot_every: int = 50
    on_unfixable: str = "raise"
    history_size: int = 10_000

    def __post_init__(self) -> None:
        self.recovery()  # validates the policy and its limits
        if self.snapshot_every < 1:
            raise ValueError(f"snapshot_every must be >= 1, got {self.snapshot_every}")
        if self.history_size < 1:
            raise ValueError(f"history_size must be >= 1, got {self.history_size}")

    @classmethod
    def checked(cls, where: str, **options: Any) -> GuardOptions:
        """The options of the call ``where`` (``nanguard.attach``, ``NanGuardCallback``); an
        unknown keyword or a bad policy is one clear error naming the call."""
        unknown = sorted(set(options) - set(cls.__dataclass_fields__))
        if unknown:
            raise TypeError(f"{where}() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; "
                            f"valid options are {', '.join(cls.__dataclass_fields__)}")
        check_policy(str(options.get("policy", "raise")), f"{where}(policy=...)")
        return cls(**options)

    def with_(self, **changes: Any) -> GuardOptions:
        return replace(self, **changes)

    def recovery(self) -> RecoveryConfig:
        return RecoveryConfig(
            policy=self.policy, max_consecutive_skips=self.max_consecutive_skips, lr_factor=self.lr_factor,
            max_recoveries=self.max_recoveries, window=self.recovery_window, on_unfixable=self.on_unfixable,
        )

    def controller(self) -> StepController:
        """The step controller every guard decides with (one per guard)."""
        return StepController(self.recovery(), History(maxlen=self.history_size))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class GuardHandle:
    """The public surface of a guard, over its :attr:`controller` (set by the subclass).

    Attributes:
        step: index of the step in progress (0 for the first).
        controller: the framework-free :class:`~nanguard.core.controller.StepController`.
        outcome: the judged outcome when training ended (:meth:`training_ended`), else ``None``.
    """

    controller: StepController
    step: int = 0
    outcome: dict[str, Any] | None = None

    @property
    def policy(self) -> str:
        """``"raise"``, ``"skip"`` or ``"recover"`` (the configuration in force)."""
        return self.controller.config.policy

    @property
    def history(self) -> History:
        """Per-step loss, gradient norm, weight norm and learning rate."""
        return self.controller.history

    @property
    def findings(self) -> list[tuple[Finding, Diagnosis]]:
        """``(Finding, Diagnosis)`` for every non-finite event, in order."""
        return self.controller.findings

    @property
    def recovery_state(self) -> RecoveryState:
        """The counters and the back-off in force (:class:`~nanguard.core.policy.RecoveryState`)."""
        return self.controller.state

    @property
    def recoveries(self) -> list[dict[str, Any]]:
        """What the policy did, one entry per action (the run log's ``recoveries``)."""
        return list(self.controller.state.recoveries)

    @property
    def notfinite_count(self) -> int:
        """Consecutive non-finite steps so far (reset by a healthy step), as optax names it."""
        return self.controller.state.notfinite_count

    @property
    def total_notfinite(self) -> int:
        """All non-finite steps of the run (skipped, dropped or rolled back)."""
        return self.controller.state.total_notfinite

    def state_dict(self) -> dict[str, Any]:
        """What the guard learned (learning-rate factor, clipping, counters, a history summary),
        to save beside a checkpoint: ``torch.save({"model": ..., "nanguard": guard.state_dict()})``."""
        return {**self.controller.state_dict(), "step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume with what :meth:`state_dict` saved: a back-off or a clipping threshold stays."""
        self.controller.load_state_dict(state)
        self.step = int(state.get("step", self.step))
        self.settings_changed()

    def settings_changed(self) -> None:
        """The back-off or the clipping threshold changed outside a step (a resume): an adapter
        that keeps them in its framework's objects pushes them there."""

    def training_ended(self, file: TextIO | None = None) -> str:
        """When a trainer callback's training ends (Keras ``on_train_end``, Hugging Face
        ``on_train_end``, Lightning ``on_fit_end``): the outcome decided, and what ``nanguard run``
        prints at the end — every event, the back-off in force, the verdict — once, on ``file``
        (stderr; nothing for a run that met no non-finite value). Returns the run's status by the
        verdict (``ok``, ``recovered``, ``unjudged``, ``not-recovered``); ``outcome`` keeps it."""
        from .render import recovery_summary

        c = self.controller
        recs, n = list(c.state.recoveries), len(c.findings)
        if not recs and not n:
            return "ok"
        self.outcome = c.run_ended(int(self.step))
        text = recovery_summary(int(self.step), recs, n, c.config.policy, self.outcome)
        if text:
            out = file or sys.stderr
            out.write(text + "\n")
            out.flush()
        return finished_status(self.outcome)

    def report(self) -> str:
        """A plain-text summary: steps, recoveries and every finding with its diagnosis."""
        from .render import format_finding

        head = (
            f"nanguard: {self.step} steps, {len(self.findings)} non-finite events, "
            f"{self.total_notfinite} skipped or rolled back"
        )
        lines = [head] + [f"  step {r['step']}: {r['description']} ({r['reason']})" for r in self.recoveries]
        body = [format_finding(f, d) for f, d in self.findings]
        return "\n\n".join(["\n".join(lines), *body])
