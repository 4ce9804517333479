"""What a diagnosis rule reads (a :class:`Case`) and what it returns (a :class:`Diagnosis`).

A rule is a plain function ``Case -> Diagnosis | None`` (see :mod:`nanguard.core.rules` and the
ordered table in :mod:`nanguard.core.diagnosis`). A :class:`Case` bundles four plain-data views of
the failure: the finding's typed :class:`~nanguard.core.evidence.Evidence`, the history's
:class:`~nanguard.core.trends.Trends`, the adapter's :class:`RunContext` and the framework's
:class:`~nanguard.core.phrases.Phrasebook` (how the user's framework spells a fix).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .evidence import Evidence
from .finding import Finding
from .history import History
from .phrases import Phrasebook, phrasebook
from .taxonomy import Cause
from .trends import Trends
from .trials import Trial

__all__ = ["Case", "DataScale", "Diagnosis", "Rule", "RunContext"]


@dataclass(frozen=True)
class DataScale:
    """How far the data of the failing step is from unit scale, as the adapter read it.

    ``inputs_absmax``: the largest |x| of the model's float inputs; ``feature_spread``: the largest
    per-feature max |x| over the smallest (non-zero) one, for inputs with features on their last
    axis; ``targets_absmax``: the largest |y| of a regression loss's targets, where found;
    ``regression``: the loss the step computed, when it is a regression loss (``"mse_loss"``,
    ``"MSELoss"``, ``"mean_squared_error"``), else ``None``."""

    inputs_absmax: float | None = None
    feature_spread: float | None = None
    targets_absmax: float | None = None
    regression: str | None = None


@dataclass
class RunContext:
    """What the adapter knows about the run, beyond the finding.

    ``optimizer`` is the class name (``"Adam"``); ``hyper`` its first param group's
    hyper-parameters (``{"lr": 10.0, "eps": 0.0}``); ``clip_norm`` a ``max_norm`` the user already
    clips at; ``framework`` picks the spelling of the suggested code (``"torch"`` or ``"keras"``).
    """

    framework: str = "torch"
    optimizer: str | None = None
    hyper: dict[str, Any] = field(default_factory=dict)
    #: the optimizer's arguments that differ from its class's defaults (``{"momentum": 0.9}``):
    #: what a suggested optimizer line keeps besides the learning rate
    kept: dict[str, Any] = field(default_factory=dict)
    clip_norm: float | None = None
    num_params: int | None = None
    scheduler: str | None = None  # the class name of an LR scheduler on that optimizer
    #: the guard's own back-off, already in ``hyper["lr"]`` (the script passed ``lr / lr_scale``)
    lr_scale: float = 1.0
    #: the script's own names: ``optimizer`` (``"opt"``) and ``params`` (``"net.parameters()"``)
    names: dict[str, str] = field(default_factory=dict)
    #: the arguments the script was given (``sys.argv[1:]``): a learning rate set by a flag
    argv: tuple[str, ...] = ()
    #: the script scales its loss itself (a ``GradScaler``, a ``LossScaleOptimizer``)
    loss_scaler: bool = False
    #: module path -> (growth of the gradient per call going back, calls at which it overflows):
    #: the recurrences the hazard look measured growing on its sampled early steps
    recurrences: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: the fixes tried on the failing step before the advice is written (policy ``raise``: see
    #: :meth:`~nanguard.core.step.StepDriver.act`): the advice says which trained
    trials: tuple[Trial, ...] = ()
    #: the scale of the failing step's data (``None``: not read)
    data_scale: DataScale | None = None

    @property
    def lr(self) -> float | None:
        lr = self.hyper.get("lr", self.hyper.get("learning_rate"))
        return float(lr) if isinstance(lr, (int, float)) else None

    @property
    def user_lr(self) -> float | None:
        """The learning rate the script asked for (before any back-off of the guard's)."""
        lr = self.lr
        return lr / self.lr_scale if lr is not None and self.lr_scale else lr

    @property
    def eps(self) -> float | None:
        """The optimizer's ``eps`` (torch) or ``epsilon`` (Keras), when it is a number."""
        eps = self.hyper.get("eps", self.hyper.get("epsilon"))
        return float(eps) if isinstance(eps, (int, float)) and not isinstance(eps, bool) else None


@dataclass
class Diagnosis:
    """One cause, how sure we are, why we think so, and what to change.

    ``evidence`` are short sentences with numbers from the run; ``fixes`` are code the user can
    paste, most likely first; ``rule`` names the rule of :data:`nanguard.core.diagnosis.RULES`
    that chose the cause.
    """

    cause: Cause
    confidence: float
    summary: str
    evidence: list[str] = field(default_factory=list)
    fixes: list[str] = field(default_factory=list)
    rule: str | None = None
    #: the fixes tried on the failing step before one was applied (``Trial.to_dict()`` each;
    #: filled in by the step controller under ``skip``/``recover``)
    trials: list[dict[str, Any]] = field(default_factory=list)
    #: the weight decay sized for the run's learning rate, where ``lr × weight_decay ≥ 1`` is the
    #: root (``recover`` sets it instead of backing the learning rate off)
    weight_decay: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "cause": self.cause.value,
            "confidence": round(self.confidence, 2),
            "summary": self.summary,
            "evidence": list(self.evidence),
            "fixes": list(self.fixes),
        }
        if self.rule is not None:
            d["rule"] = self.rule
        if self.trials:
            d["trials"] = [dict(t) for t in self.trials]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Diagnosis:
        return cls(
            cause=Cause(d["cause"]),
            confidence=float(d.get("confidence", 0.0)),
            summary=d.get("summary", ""),
            evidence=list(d.get("evidence", [])),
            fixes=list(d.get("fixes", [])),
            rule=d.get("rule"),
            trials=[dict(t) for t in d.get("trials", [])],
        )


@dataclass(frozen=True)
class Case:
    """Everything one rule may read: the evidence, the trends, the run context, the phrasebook."""

    ev: Evidence
    trend: Trends = field(default_factory=Trends)
    ctx: RunContext = field(default_factory=RunContext)
    say: Phrasebook = field(default_factory=lambda: phrasebook("torch"))

    @classmethod
    def of(cls, finding: Finding, history: History | None = None,
           context: RunContext | None = None) -> Case:
        """The case of one finding; the phrasebook follows ``context.framework``."""
        ctx = context if context is not None else RunContext(framework=finding.framework)
        return cls(
            ev=Evidence.of(finding),
            trend=Trends.of(history if history is not None else History()),
            ctx=ctx,
            say=phrasebook(ctx.framework),
        )

    @property
    def first_step(self) -> bool:
        """No update had been applied before the failing step."""
        return self.ev.headroom.first_step or self.ev.step == 0 or self.trend.healthy_steps == 0

    @property
    def shown(self) -> str:
        """The op as the user's framework names it: ``addmm`` for torch, ``MatMul`` for Keras."""
        return self.say.op_label(self.ev.op, self.ev.op_name)

    @property
    def opt(self) -> str:
        """The optimizer's class name (``SGD`` when not known)."""
        return self.ctx.optimizer or "SGD"

    @property
    def names(self) -> dict[str, str]:
        """``optvar`` and ``params`` for a suggested line: the script's own names for its
        optimizer and the module it updates, where they were found."""
        return {"optvar": self.ctx.names.get("optimizer", "optimizer"),
                "params": self.ctx.names.get("params", "model.parameters()")}

    def kept(self, *drop: str) -> str:
        """``", momentum=0.9, weight_decay=0.0001"``: the script's own optimizer arguments, for a
        suggested optimizer line to keep (``drop``: those the line sets itself)."""
        return "".join(f", {k}={v!r}" for k, v in self.ctx.kept.items()
                       if k not in drop and k not in ("lr", "learning_rate"))


#: a diagnosis rule: the diagnosis when it applies to the case, else ``None``
Rule = Callable[[Case], "Diagnosis | None"]
