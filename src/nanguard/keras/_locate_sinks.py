"""The Keras locator's origins and sinks: where a non-finite value was made (a new origin, a
variable read, a tensor from outside, a laundered ``-inf``), and where it is reported (the target
of ``GradientTape.gradient``, the gradients it returns, a variable the optimizer writes).

:class:`OriginsAndSinks` is the part of :class:`~nanguard.keras.locate.Locator` that runs after
an op's output was found non-finite, or at a sink; the op callback itself is in ``locate``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.errors import NonFiniteError
from ..core.finding import Finding, TensorStats
from ..core.ops import LOW_PRECISION, dtype_max
from ._compat import tf, values_of, var_path
from ._stats import bad_samples, finding_for, is_finite, tensor_stats, to_numpy

__all__ = ["Origin", "OriginsAndSinks"]

log = logging.getLogger("nanguard")

_SEQ = itertools.count()
_LOW_ENUMS = {tf.float16.as_datatype_enum, tf.bfloat16.as_datatype_enum}


@dataclass
class Origin:
    """Where one family of non-finite values came from."""

    finding: Finding
    seq: int = field(default_factory=lambda: next(_SEQ))
    deliberate: bool = False
    relu_note: str | None = None
    relu_layer: str | None = None


@dataclass
class _Where:
    path: str | None
    typ: str | None
    source: str | None
    code: str | None
    grad_fn: str | None = None


def _float(t: Any) -> bool:
    dt = getattr(t, "dtype", None)
    return bool(getattr(dt, "is_floating", False)) and hasattr(t, "_id")

def _input_names(op_type: str, n: int) -> list[str]:
    try:
        from tensorflow.python.framework import op_def_registry

        op_def = op_def_registry.get(op_type)
    except Exception:  # an unregistered or function op
        log.debug("nanguard: no op definition for %s", op_type, exc_info=True)
        op_def = None
    names: list[str] = []
    if op_def is not None:
        for arg in op_def.input_arg:
            names.append(arg.name)
    names += [f"input {i}" for i in range(len(names), n)]
    return names[:n] if len(names) >= n else names

def _float32_check(op_type: str, inputs: Sequence[Any], attrs: Any, f: Finding) -> None:
    """Would the same op have been finite in float32? (evidence for low-precision overflow)"""
    from tensorflow.python.eager import context, execute

    try:
        # dtype attributes come as enums or as ``tf.DType`` (Cast's ``DstT``): enums for the re-run
        attrs = tuple(v.as_datatype_enum if isinstance(v, tf.DType) else v for v in (attrs or ()))
        new_attrs = tuple(
            tf.float32.as_datatype_enum if (i % 2 == 1 and isinstance(v, int) and not isinstance(v, bool)
                                            and v in _LOW_ENUMS and attrs[i - 1] in ("T", "dtype", "Tout", "DstT"))
            else v
            for i, v in enumerate(attrs)
        )
        ins = [tf.cast(t, tf.float32) if getattr(t, "dtype", None) in (tf.float16, tf.bfloat16) else t
               for t in inputs]
        outs = execute.quick_execute(op_type, 1, ins, new_attrs, context.context())
        a = to_numpy(outs[0])
        fin = a[np.isfinite(a)]
        f.details["float32_finite"] = bool(np.isfinite(a).all())
        if fin.size:
            f.details["float32_absmax"] = float(np.abs(fin).max())
    except Exception:  # the op cannot be re-run this way: no evidence, no harm
        log.debug("nanguard: the float32 re-run of an op failed", exc_info=True)
        return


@dataclass
class _Made:
    """Where the tensors of the traced step were made: ``id`` -> the op that produced it, the
    place of a forward op's outputs (and, by its inputs, of its gradient), a backward op's."""

    producer: dict[int, str] = field(default_factory=dict)
    fwd_out: dict[int, _Where] = field(default_factory=dict)
    fwd_in: dict[tuple[Any, ...], _Where] = field(default_factory=dict)
    bwd_out: dict[int, _Where] = field(default_factory=dict)


@dataclass
class _Phase:
    """Where in the step the locator is: inside a gradient computation, just after one, inside
    the optimizer's update, busy with its own ops, or told to keep quiet."""

    in_backward: int = 0
    after_backward: bool = False
    opt_depth: int = 0
    busy: bool = False
    quiet: int = 0


class OriginsAndSinks:
    """Origins and sinks of the Keras locator (its state is set by ``Locator.__init__``)."""

    on_sink: str
    step: int | None
    detected_by: str
    findings: list[Finding]
    applied: list[Any]
    _tracked: dict[int, Origin]
    made: _Made
    state: _Phase
    _var_names: dict[int, str]
    _slot_ids: set[int]

    def _where(self, phase: str, inputs: Sequence[Any] = ()) -> _Where:
        raise NotImplementedError  # Locator's

    def optimizer_phase(self, opt: Any) -> contextlib.AbstractContextManager[None]:
        raise NotImplementedError  # Locator's

    def _laundered(
        self, op_type: str, outputs: tuple[Any, ...], origin: Origin, phase: str, where: _Where | None
    ) -> None:
        """A non-finite input came out as the dtype's largest finite value (``MaxPool`` of NaN
        gives -3.4e38): still the same bad values, so the output keeps the input's origin."""
        for o in outputs:
            if not _float(o):
                continue
            a = to_numpy(o)
            big = dtype_max(o.dtype.name) or float(tf.as_dtype(o.dtype).max)
            if a.size and float(np.abs(a).max()) >= big:
                self._tracked[o._id] = origin
                w = where or self._where(phase)
                origin.finding.details.setdefault(
                    "note",
                    f"`{op_type}`" + (f" in `{w.path}`" if w.path else "")
                    + f" turned the non-finite values into ±{big:.3g}, finite but garbage; "
                    "they overflowed again further on",
                )

    def _check_write(self, op_type: str, inputs: tuple[Any, ...], phase: str) -> None:
        value = inputs[1]
        if not _float(value) or is_finite(value):
            return
        origin = self._tracked.get(value._id)
        if origin is None:
            where = self._where(phase)
            origin = self._new_origin(op_type, inputs[1:], (), value, phase, where)
        hid = getattr(inputs[0], "_id", None)
        name = self._var_names.get(hid, "a variable") if hid is not None else "a variable"
        f = origin.finding
        if f.phase == "optimizer" and f.module is None and "/" in name and hid not in self._slot_ids:
            f.module = name.rsplit("/", 1)[0]  # the optimizer's op: name the layer it updated
        if hid in self._slot_ids:
            self._reached(origin, "optimizer state", parameters=[name])
        else:
            self._reached(origin, "parameters", parameters=[name])

    def _parameter_origin(self, handle: Any, out: Any, phase: str) -> Origin:
        name = self._var_names.get(getattr(handle, "_id", -1))
        module = name.rsplit("/", 1)[0] if name and "/" in name else None
        f = finding_for(
            out,
            phase if phase != "data" else "forward",
            "parameter",
            module=module,
            step=self.step,
            detected_by=self.detected_by,
            details={"origin": "parameter", "parameters": [name] if name else []},
        )
        return Origin(f)

    def _outside_origin(self, t: Any, phase: str) -> Origin:
        where = self._where(phase)
        f = finding_for(
            t,
            "data",
            "input",
            module=where.path,
            module_type=where.typ,
            source=where.source,
            source_code=where.code,
            step=self.step,
            detected_by=self.detected_by,
            details={"origin": "data", "input_name": "a tensor from outside the model",
                     "samples": bad_samples(t)},
        )
        return Origin(f)

    def _new_origin(
        self,
        op_type: str,
        inputs: Sequence[Any],
        attrs: Any,
        out: Any,
        phase: str,
        where: _Where,
    ) -> Origin:
        names = _input_names(op_type, len(inputs))
        stats: list[TensorStats] = []
        scalars: dict[str, Any] = {}
        producers: list[str] = []
        for i, t in enumerate(inputs):
            name = names[i] if i < len(names) else f"input {i}"
            if not _float(t):
                continue
            if len(stats) < 6:
                stats.append(tensor_stats(t, name))
            p = self.made.producer.get(t._id)
            if p:
                producers.append(p)
            if op_type == "Pow" and i == 1 and int(np.prod(t.shape)) == 1:
                scalars["exponent"] = float(to_numpy(t).reshape(-1)[0])
        details: dict[str, Any] = {}
        if producers:
            details["input_producers"] = producers[:4]
        f = finding_for(
            out,
            phase,
            op_type,
            module=where.path,
            module_type=where.typ,
            source=where.source,
            source_code=where.code,
            grad_fn=where.grad_fn if phase == "backward" else None,
            step=self.step,
            detected_by=self.detected_by,
            inputs=stats,
            scalars=scalars,
            details=details,
        )
        if f.dtype in LOW_PRECISION and (f.posinf or f.neginf or f.nan):
            _float32_check(op_type, inputs, attrs, f)
        return Origin(f)

    def on_gradient_start(self, target: Any) -> None:
        """``tape.gradient(target, ...)`` begins: a non-finite target is a loss that is not."""
        self.state.busy = True
        try:
            for t in tf.nest.flatten(target):
                if _float(t) and not is_finite(t):
                    origin = self._tracked.get(t._id) or self._unknown(t, "forward", "the loss")
                    self._reached(origin, "loss")
        finally:
            self.state.busy = False
        self.state.in_backward += 1

    def on_gradient_abort(self) -> None:
        self.state.in_backward = max(0, self.state.in_backward - 1)

    def on_gradient_end(self, grads: Any, sources: Any) -> None:
        self.state.in_backward = max(0, self.state.in_backward - 1)
        if not self.state.in_backward:
            self.state.after_backward = True
        self.state.busy = True
        try:
            self._check_grads(tf.nest.flatten(grads), tf.nest.flatten(sources))
        finally:
            self.state.busy = False

    def _check_grads(self, grads: Sequence[Any], sources: Sequence[Any]) -> None:
        for g, s in zip(grads, sources):
            if g is None:
                continue
            v = values_of(g)
            if not _float(v) or is_finite(v):
                continue
            origin = self._tracked.get(v._id) or self._unknown(v, "backward", "a gradient")
            self._reached(origin, "gradients", gradients=[var_path(s)])

    def on_apply(self, opt: Any, grads: Any, trainable_variables: Any, orig: Any) -> None:
        """The replay reached ``optimizer.apply``: the optimizer phase, but no update."""
        with self.optimizer_phase(opt):
            self.applied.append(opt)
            tv = list(trainable_variables) if trainable_variables is not None else list(
                getattr(opt, "_trainable_variables", [])
            )
            self.state.busy = True
            try:
                self._check_grads(list(grads), tv)
            finally:
                self.state.busy = False
        return None

    def _unknown(self, t: Any, phase: str, what: str) -> Origin:
        f = finding_for(
            t,
            phase,
            None,
            step=self.step,
            detected_by=self.detected_by,
            details={"note": f"{what} was non-finite, but no op the locator saw made it "
                     "(compiled code, or a tensor made before the locator started)"},
        )
        return Origin(f)

    def _reached(self, origin: Origin, what: str, **details: Any) -> None:
        f = origin.finding
        f.mark_reached(what, self.step, **details)
        if origin.relu_note and "relu_grad" not in f.details and f.phase in ("data", "forward"):
            f.details["relu_grad"] = origin.relu_note
            f.details["relu_grad_layer"] = origin.relu_layer
        if any(x is f for x in self.findings):
            return
        self.findings.append(f)
        if self.on_sink == "raise":
            raise NonFiniteError(f)

    def first(self) -> Finding | None:
        return self.findings[0] if self.findings else None
