"""The structured description of where a non-finite value was made.

A :class:`Finding` is produced by an adapter (the torch locator, the Keras replay) at the moment a
non-finite value reaches something that matters (the loss, a gradient, a weight). It is plain data:
numbers and strings, no framework objects, so the core rules and reports can use it anywhere.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .evidence import Evidence

__all__ = ["Finding", "TensorStats", "describe_values"]


def _num(x: float | None) -> float | None:
    """JSON has no NaN/Inf; keep them as None (the counts say what was non-finite)."""
    if x is None or not math.isfinite(x):
        return None
    return float(x)


def describe_values(
    nan: int, posinf: int, neginf: int, dtype: str | None, shape: tuple[int, ...]
) -> str:
    """``2 NaN, 3 -Inf in float32[64, 10]``: the non-finite counts of a tensor and its type."""
    parts = []
    if nan:
        parts.append(f"{nan} NaN")
    if posinf:
        parts.append(f"{posinf} +Inf")
    if neginf:
        parts.append(f"{neginf} -Inf")
    counts = ", ".join(parts) or "non-finite values"
    if dtype:
        dims = ", ".join(str(s) for s in shape)
        return f"{counts} in {dtype}[{dims}]"
    return counts


@dataclass
class TensorStats:
    """Statistics of one tensor that explain an operation's result.

    ``min``/``max``/``absmax`` are taken over the *finite* elements only; ``None`` when there are
    none. ``smallest_abs_nonzero`` helps explain divisions and logs of tiny numbers.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    numel: int
    nan: int = 0
    posinf: int = 0
    neginf: int = 0
    zeros: int = 0
    negatives: int = 0
    min: float | None = None
    max: float | None = None
    absmax: float | None = None
    smallest_abs_nonzero: float | None = None

    @property
    def nonfinite(self) -> int:
        return self.nan + self.posinf + self.neginf

    def describe(self) -> str:
        """One line, e.g. ``input 0: float32[64, 10], 17 zeros, min 0, max 0.98``."""
        shape = ", ".join(str(s) for s in self.shape)
        parts = [f"{self.name}: {self.dtype}[{shape}]"]
        if self.nan:
            parts.append(f"{self.nan} NaN")
        if self.posinf:
            parts.append(f"{self.posinf} +Inf")
        if self.neginf:
            parts.append(f"{self.neginf} -Inf")
        if self.zeros:
            parts.append(f"{self.zeros} zeros")
        if self.negatives:
            parts.append(f"{self.negatives} negative")
        if self.min is not None and self.max is not None:
            parts.append(f"min {self.min:.4g}, max {self.max:.4g}")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["shape"] = list(self.shape)
        for k in ("min", "max", "absmax", "smallest_abs_nonzero"):
            d[k] = _num(d[k])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TensorStats:
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        kw["shape"] = tuple(kw.get("shape", ()))
        return cls(**kw)


@dataclass
class Finding:
    """Where the first non-finite value that mattered was made.

    Attributes:
        phase: ``"data"``, ``"forward"``, ``"backward"`` or ``"optimizer"``.
        op: the framework op that made it from finite inputs (``"aten.log.default"``); for data
            the name of the input (``"input"``), for already bad weights ``"parameter"``.
        module: the innermost module's path relative to the model (``"encoder.layers.3.fc1"``),
            ``""`` for the model itself, ``None`` outside any module.
        module_type: class name of that module (``"Linear"``).
        source: ``"file.py:LINE"`` of the user's code that ran the op (for a backward op: the
            forward line that created its autograd node).
        grad_fn: for a backward op, the autograd node it ran in (``"SqrtBackward0"``).
        step: the optimizer step (0-based) when known.
        reached: what the non-finite value reached: ``"loss"``, ``"gradients"``, ``"parameters"``,
            ``"output"``.
        inputs: statistics of the op's tensor inputs (what explains the result).
        scalars: the op's non-tensor arguments that matter (``{"exponent": 0.5}``).
        details: adapter-specific evidence (bad sample indices, parameter names, activation
            scale per layer, ...), JSON-compatible.
    """

    phase: str
    op: str | None
    module: str | None = None
    module_type: str | None = None
    source: str | None = None
    source_code: str | None = None
    grad_fn: str | None = None
    step: int | None = None
    dtype: str | None = None
    shape: tuple[int, ...] = ()
    nan: int = 0
    posinf: int = 0
    neginf: int = 0
    reached: str | None = None
    detected_by: str = "trace"
    framework: str = "torch"
    rank: int | None = None
    inputs: list[TensorStats] = field(default_factory=list)
    scalars: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def where(self) -> str:
        """The module as a person reads it: ``encoder.fc1 (Linear)``, ``MLP (the model)``."""
        if self.module is None:
            if self.details.get("module_unknown"):
                return "not known (this step's ops were not recorded)"
            return "outside any module"
        if self.module == "":
            return f"{self.module_type or 'model'} (top-level module)"
        return f"{self.module} ({self.module_type})" if self.module_type else self.module

    @property
    def what(self) -> str:
        """``2 NaN, 3 -Inf in float32[64, 10]``."""
        return describe_values(self.nan, self.posinf, self.neginf, self.dtype, self.shape)

    @property
    def evidence(self) -> Evidence:
        """The typed view of this finding that the diagnosis rules read (:class:`Evidence`)."""
        from .evidence import Evidence

        return Evidence.of(self)

    @property
    def op_short(self) -> str | None:
        """``log`` for ``aten.log.default``, ``add_`` for ``aten.add_.Tensor``."""
        if self.op is None:
            return None
        parts = self.op.split(".")
        if parts[0] in ("aten", "prims", "tf", "keras") and len(parts) >= 2:
            return parts[1]
        return parts[0]

    def mark_reached(self, what: str, step: int | None, **details: Any) -> None:
        """The value made here reached ``what`` (``"loss"``, ``"gradients"``, ...): called by a
        locator at the first sink, and again by later ones, which only add what is new."""
        if self.reached is None:
            self.reached = what
        for k, v in details.items():
            if v and k not in self.details:
                self.details[k] = v
        if self.step is None:
            self.step = step

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["shape"] = list(self.shape)
        d["inputs"] = [s.to_dict() for s in self.inputs]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Finding:
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        kw["shape"] = tuple(kw.get("shape", ()))
        kw["inputs"] = [TensorStats.from_dict(s) for s in kw.get("inputs", [])]
        return cls(**kw)
