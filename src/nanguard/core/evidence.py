"""Typed evidence: what the diagnosis rules know about a finding, as fields instead of string keys.

The adapters (the torch locator and guard, the Keras locator and guard) describe a finding with
top-level fields (op, phase, module, inputs, ...) and a free-form ``details`` dict. :meth:`Evidence.of`
reads both once, checks their types and turns the documented ``details`` keys into fields, grouped
in four small records (:class:`Provenance`, :class:`Update`, :class:`Headroom`, :class:`Notes`:
``ev.update.clip_total_norm``); the rules in :mod:`nanguard.core.rules` read nothing else.
``details`` keys this module does not type are kept in :attr:`Notes.other`, so
:meth:`Evidence.to_details` gives back what came in, flat as it came (less keys whose value was
empty): a finding written to the run log (``docs/runlog.md``) and read back has the same evidence,
and so does :meth:`Evidence.to_dict` read with :meth:`Evidence.from_dict`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from .finding import Finding, TensorStats, describe_values
from .ops import DTYPE_MAX, LOW_PRECISION, canonical_op, forward_op_of_grad_fn

__all__ = ["Evidence", "Headroom", "MaskSource", "Notes", "Provenance", "Sample", "Update"]


def _float(x: Any) -> float | None:
    """A number from the adapter or from the run log (where non-finite numbers are strings)."""
    if isinstance(x, bool) or x is None:
        return None
    if isinstance(x, (int, float)):
        return float(x)
    if isinstance(x, str):
        try:
            return float(x)
        except ValueError:
            return None
    try:  # numpy scalars
        return float(x)
    except (TypeError, ValueError):
        return None


def _str(x: Any) -> str | None:
    return None if x is None else str(x)


def _names(x: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in x) if isinstance(x, (list, tuple)) else ()


def _feature(x: Any) -> int | tuple[int, ...]:
    return tuple(int(v) for v in x) if isinstance(x, (list, tuple)) else int(x)


@dataclass(frozen=True)
class Sample:
    """One bad sample of a batch: its index (dimension 0), ``NaN``/``Inf``/``+Inf``, and the
    features that hold it (an index, or a position for samples with more than one dimension;
    ``None`` for a one-dimensional batch)."""

    index: int | None
    kind: str = "NaN"
    features: tuple[int | tuple[int, ...], ...] | None = None
    #: its index in the dataset, through the loader's sampler (when a DataLoader made the batch)
    dataset_index: int | None = None

    @classmethod
    def of(cls, d: Mapping[str, Any]) -> Sample:
        feats = d.get("features")
        idx, row = d.get("index"), d.get("dataset_index")
        return cls(
            index=int(idx) if isinstance(idx, (int, float)) else None,
            kind=str(d.get("kind", "NaN")),
            features=tuple(_feature(v) for v in feats) if isinstance(feats, (list, tuple)) else None,
            dataset_index=int(row) if isinstance(row, int) else None,
        )

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"index": self.index, "kind": self.kind}
        if self.features is not None:
            d["features"] = [list(v) if isinstance(v, tuple) else v for v in self.features]
        if self.dataset_index is not None:
            d["dataset_index"] = self.dataset_index
        return d


@dataclass(frozen=True)
class MaskSource:
    """Where an intended ``-inf`` (a mask) was written, when a later op turned it into NaN."""

    op: str | None = None
    source: str | None = None
    module: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "source": self.source, "module": self.module}


#: details keys whose field has another name
_KEY_OF = {"masked_inf": "from_masked_inf"}


@dataclass(frozen=True)
class Provenance:
    """``details``: where the value came from (a bad batch, a bad weight, a mask, the op's inputs)."""

    #: ``"data"`` (the batch), ``"parameter"`` (an already bad weight) or ``None`` (an op made it)
    origin: str | None = None
    #: the name of the bad input (data findings)
    input_name: str | None = None
    #: the bad rows of the batch (data findings)
    samples: tuple[Sample, ...] = ()
    #: the dataset holds that row finite: reading the sample made it (``"Tiles.__getitem__"``)
    read_computed: str | None = None
    #: the first module a bad input entered (data findings)
    entered: str | None = None
    #: weights that were non-finite (before the step, or first after it)
    parameters: tuple[str, ...] = ()
    #: gradients the value reached
    gradients: tuple[str, ...] = ()
    #: optimizer state (``exp_avg_sq`` ...) non-finite after the step
    optimizer_state: tuple[str, ...] = ()
    #: an explicit non-finite literal the code wrote (``"-inf"``, ``"nan"``): a constant mask
    constant: str | None = None
    #: an intended ``-inf`` that this op turned into NaN (softmax over a row masked entirely);
    #: the ``details`` key is ``from_masked_inf``
    masked_inf: MaskSource | None = None
    #: the ops that produced the op's inputs (``softmax`` before a ``log``), canonical or not
    input_producers: tuple[str, ...] = ()
    #: the ``torch.autograd.Function`` whose hand-written backward ran the op
    custom_function: str | None = None


@dataclass(frozen=True)
class Update:
    """``details``: the gradients and the update (clipping, the optimizer step)."""

    #: the sink description, when the value reached something other than the usual sinks
    sink: str | None = None
    #: the total gradient norm ``clip_grad_norm_`` returned, when the value reached it (non-finite:
    #: the norm overflowed and clipping scaled every gradient by 0)
    clip_total_norm: float | None = None
    #: the gradients' global norm the optimizer step saw (optimizer findings)
    grad_norm: float | None = None
    #: whether every gradient was finite before the step (optimizer findings; ``None``: unknown)
    grads_finite: bool | None = None


@dataclass(frozen=True)
class Headroom:
    """``details``: the dtype's headroom and the activations' scale."""

    #: whether the same op in float32 stays finite (float16/bfloat16 findings)
    float32_finite: bool | None = None
    #: the largest magnitude the op reaches in float32 (compare with the dtype's maximum)
    float32_absmax: float | None = None
    #: max |x| at the output of each module, in call order, during the failing step
    activation_scale: tuple[tuple[str, float], ...] = ()
    #: no healthy step ran before this one (the guard says so)
    first_step: bool = False


@dataclass(frozen=True)
class Notes:
    """``details``: for the reader, and every key the other groups do not type."""

    note: str | None = None
    relu_grad: str | None = None
    relu_grad_layer: str | None = None
    #: every other ``details`` key, as the adapter wrote it
    other: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Evidence:
    """Everything a diagnosis rule may read about one finding (plain numbers and strings).

    The top-level fields repeat the finding's own fields: what was made (``dtype``, ``shape``,
    non-finite counts), by which op, where, and what it reached. The four groups after them are
    the typed form of the documented ``details`` keys (``docs/runlog.md``); a field is ``None`` /
    empty when the adapter did not report it.
    """

    # --- the finding itself -------------------------------------------------------------------
    phase: str
    op: str | None = None
    framework: str = "torch"
    module: str | None = None
    module_type: str | None = None
    source: str | None = None
    grad_fn: str | None = None
    step: int | None = None
    dtype: str | None = None
    shape: tuple[int, ...] = ()
    nan: int = 0
    posinf: int = 0
    neginf: int = 0
    #: what the value reached: ``loss``, ``gradients``, ``parameters``, ``optimizer state``, ...
    reached: str | None = None
    #: statistics of the op's tensor inputs, in argument order
    inputs: tuple[TensorStats, ...] = ()
    #: the op's non-tensor arguments (``{"exponent": 0.5}``)
    scalars: Mapping[str, Any] = field(default_factory=dict)

    # --- details, typed -----------------------------------------------------------------------
    #: where it came from: ``origin``, ``samples``, ``parameters``, ``masked_inf``, ...
    provenance: Provenance = field(default_factory=Provenance)
    #: the gradients and the update: ``clip_total_norm``, ``grad_norm``, ``grads_finite``, ...
    update: Update = field(default_factory=Update)
    #: dtype headroom and activations: ``float32_finite``, ``activation_scale``, ``first_step``, ...
    headroom: Headroom = field(default_factory=Headroom)
    #: for the reader (``note``, ``relu_grad``), and every other key in ``other``
    notes: Notes = field(default_factory=Notes)

    # ------------------------------------------------------------------------------------------
    @classmethod
    def of(cls, finding: Finding) -> Evidence:
        """The evidence of ``finding`` (its own fields, and its ``details`` typed)."""
        f = finding
        d = dict(f.details)
        kw: dict[str, Any] = {
            "phase": f.phase,
            "op": f.op,
            "framework": f.framework,
            "module": f.module,
            "module_type": f.module_type,
            "source": f.source,
            "grad_fn": f.grad_fn,
            "step": f.step,
            "dtype": f.dtype,
            "shape": tuple(int(s) for s in f.shape),
            "nan": int(f.nan),
            "posinf": int(f.posinf),
            "neginf": int(f.neginf),
            "reached": f.reached,
            "inputs": tuple(f.inputs),
            "scalars": dict(f.scalars),
        }
        kw.update(_typed_details(d))
        return cls(**kw)

    def to_details(self) -> dict[str, Any]:
        """The ``details`` dict this evidence was read from (JSON-compatible values; a key whose
        value was empty — ``[]``, ``None``, ``first_step: False`` — is left out)."""
        out: dict[str, Any] = {}
        for group in (self.provenance, self.update, self.headroom, self.notes):
            for f in fields(group):
                name = f.name
                v = getattr(group, name)
                if name == "other" or v is None or v == () or (name == "first_step" and not v):
                    continue
                out[_KEY_OF.get(name, name)] = _detail_value(name, v)
        out.update(self.notes.other)
        return out

    # --- derived views the rules share ------------------------------------------------------
    @property
    def op_name(self) -> str:
        """The canonical op name (``log`` for ``aten.log.default`` and for TF's ``Log``)."""
        return canonical_op(self.op)

    @property
    def forward_op(self) -> str:
        """The forward op a person recognises: for a backward finding, the op of its grad_fn."""
        if self.phase == "backward":
            fwd = forward_op_of_grad_fn(self.grad_fn)
            if fwd:
                return canonical_op(fwd)
        return self.op_name

    @property
    def what(self) -> str:
        """``2 NaN, 3 -Inf in float32[64, 10]``."""
        return describe_values(self.nan, self.posinf, self.neginf, self.dtype, self.shape)

    @property
    def where(self) -> str:
        """``in `encoder.fc1` (model.py:12)``, ``at model.py:12`` or ``in your code``."""
        loc = f"`{self.module}`" if self.module else ("the model's own forward" if self.module == "" else "")
        src = f" ({self.source})" if self.source else ""
        if loc:
            return f"in {loc}{src}"
        return f"at {self.source}" if self.source else "in your code"

    @property
    def infinite(self) -> bool:
        """The op made ±Inf (not only NaN)."""
        return bool(self.posinf or self.neginf)

    @property
    def nonfinite(self) -> bool:
        return bool(self.nan or self.posinf or self.neginf)

    @property
    def largest_input(self) -> float:
        """The largest finite magnitude among the op's inputs (0 when unknown)."""
        return max((s.absmax or 0.0 for s in self.inputs), default=0.0)

    def input(self, i: int) -> TensorStats | None:
        """The statistics of input ``i`` (``None`` when the op has fewer)."""
        return self.inputs[i] if 0 <= i < len(self.inputs) else None

    @property
    def producers(self) -> list[str]:
        """The canonical names of the ops that produced the inputs (``softmax``, ``sigmoid``)."""
        return [canonical_op(p) for p in self.provenance.input_producers if p]

    @property
    def clip_overflow(self) -> bool:
        """The value reached the total norm ``clip_grad_norm_`` returned, and that norm is not
        finite: every gradient was scaled by 0."""
        norm = self.update.clip_total_norm
        return norm is not None and not math.isfinite(norm)

    @property
    def dtype_max(self) -> float | None:
        """The largest finite value of a float16/bfloat16 output (``None`` for wider dtypes)."""
        return DTYPE_MAX[self.dtype] if self.dtype in LOW_PRECISION else None

    @property
    def exceeds_dtype_in_float32(self) -> bool:
        """In float32 the op stays finite, or reaches more than this low-precision dtype holds."""
        top = self.dtype_max
        if top is None:
            return False
        room = self.headroom
        return bool(room.float32_finite) or (
            room.float32_absmax is not None and room.float32_absmax > top
        )

    @property
    def exponent(self) -> Any:
        """The op's ``exponent`` argument (``pow``), as given."""
        return self.scalars.get("exponent")

    @property
    def divides_by_scalar_zero(self) -> bool:
        """A division whose divisor is the Python number 0."""
        return self.scalars.get("other") == 0

    @property
    def activation_peak(self) -> float | None:
        """The largest module output magnitude recorded (±Inf counts as the largest; a NaN says
        nothing about scale and is left out); ``None`` when none was recorded."""
        vals = [v for _, v in self.headroom.activation_scale if not math.isnan(v)]
        return max(vals) if vals else None

    def to_dict(self) -> dict[str, Any]:
        """The evidence as one JSON-compatible dict (non-finite numbers as strings)."""
        out: dict[str, Any] = {
            "phase": self.phase, "op": self.op, "framework": self.framework, "module": self.module,
            "module_type": self.module_type, "source": self.source, "grad_fn": self.grad_fn,
            "step": self.step, "dtype": self.dtype, "shape": list(self.shape), "nan": self.nan,
            "posinf": self.posinf, "neginf": self.neginf, "reached": self.reached,
            "inputs": [s.to_dict() for s in self.inputs], "scalars": dict(self.scalars),
            "details": self.to_details(),
        }
        safe: dict[str, Any] = _json_safe(out)
        return safe

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Evidence:
        """Read :meth:`to_dict`'s dict, or a run log's event (same keys)."""
        return cls.of(Finding.from_dict(dict(d)))


def _typed_details(d: Mapping[str, Any]) -> dict[str, Any]:
    """The documented ``details`` keys, each read with its type, in their groups (the keyword
    arguments of :class:`Evidence` after the finding's own)."""
    scale = []
    for item in d.get("activation_scale") or ():
        if isinstance(item, (list, tuple)) and len(item) == 2:
            v = _float(item[1])
            scale.append((str(item[0]), math.nan if v is None else v))
    masked = d.get("from_masked_inf")
    flag = d.get("grads_finite")
    f32 = d.get("float32_finite")
    return {
        "provenance": Provenance(
            origin=_str(d.get("origin")),
            input_name=_str(d.get("input_name")),
            samples=tuple(Sample.of(s) for s in d.get("samples") or () if isinstance(s, Mapping)),
            read_computed=_str(d.get("read_computed")),
            entered=_str(d.get("entered")),
            parameters=_names(d.get("parameters")),
            gradients=_names(d.get("gradients")),
            optimizer_state=_names(d.get("optimizer_state")),
            constant=_str(d.get("constant")),
            masked_inf=MaskSource(
                op=_str(masked.get("op")), source=_str(masked.get("source")), module=_str(masked.get("module"))
            ) if isinstance(masked, Mapping) else None,
            input_producers=_names(d.get("input_producers")),
            custom_function=_str(d.get("custom_function")),
        ),
        "update": Update(
            sink=_str(d.get("sink")),
            clip_total_norm=_float(d.get("clip_total_norm")),
            grad_norm=_float(d.get("grad_norm")),
            grads_finite=None if flag is None else bool(flag),
        ),
        "headroom": Headroom(
            float32_finite=None if f32 is None else bool(f32),
            float32_absmax=_float(d.get("float32_absmax")),
            activation_scale=tuple(scale),
            first_step=bool(d.get("first_step", False)),
        ),
        "notes": Notes(
            note=_str(d.get("note")),
            relu_grad=_str(d.get("relu_grad")),
            relu_grad_layer=_str(d.get("relu_grad_layer")),
            other={k: v for k, v in d.items() if k not in _KNOWN},
        ),
    }


#: the ``details`` keys not kept in :attr:`Notes.other`: the field names of the evidence (less its
#: groups) and of its groups (``from_masked_inf`` for ``masked_inf``)
_KNOWN = frozenset(
    _KEY_OF.get(n, n)
    for n in [
        *(f.name for f in fields(Evidence) if f.name not in ("provenance", "update", "headroom", "notes")),
        *(f.name for g in (Provenance, Update, Headroom, Notes) for f in fields(g)),
    ]
)


def _detail_value(name: str, v: Any) -> Any:
    if name == "samples":
        return [s.to_dict() for s in v]
    if name == "masked_inf":
        return v.to_dict()
    if name == "activation_scale":
        return [[n, x] for n, x in v]
    if isinstance(v, tuple):
        return list(v)
    return v


def _json_safe(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, Mapping):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x
