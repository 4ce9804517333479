"""The Keras locator: find the TensorFlow op that made the first non-finite value, with provenance.

TensorFlow's own numerics machinery is the hook: an *op callback*
(``tensorflow.python.framework.op_callbacks``, what ``tf.debugging.enable_check_numerics`` uses)
sees every op that runs eagerly — the forward pass, the backward pass (``tf.GradientTape`` runs the
gradient functions eagerly, so ``ReluGrad``, ``SqrtGrad``, ``Reciprocal`` … pass through it too)
and the optimizer's update. Only eager ops are seen, so the locator runs the code with
``tf.config.run_functions_eagerly(True)``. For each floating output it asks one question: is it
finite? When it is not:

* a non-finite input that the locator already tracks passes its *origin* on to the output;
* a variable read (``ReadVariableOp``) that returns non-finite values is an origin of kind
  ``parameter``; a batch tensor registered with :meth:`Locator.register_batch` one of kind ``data``;
  a non-finite tensor that came from elsewhere is a *constant* (a ``-inf`` mask) or ``data``;
* otherwise the op itself is a new origin: op type (``Log``, ``MatMul``), phase, Keras layer path
  (``sequential/dense_2``, from the stack of running layers), source line, input statistics.

Backward ops are tied to the forward op they differentiate by re-registering TensorFlow's eager
gradient function (``backprop._gradient_function``): while the gradient of a forward op runs, its
ops carry that op's layer path and source line, and ``grad_fn`` names the gradient function
(``_SqrtGrad``).

Nothing is reported when an origin is made — a ``-inf`` mask that a softmax absorbs is no finding.
A finding is reported when a non-finite value *reaches* a sink: the target of
``GradientTape.gradient`` (the loss), a gradient it returns, or a variable written in the
optimizer phase. The finding is the origin whose values got there.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..core.finding import Finding
from ..core.ops import OpTraits, on_traits_change, op_traits
from ..core.source import SourceLocation, user_frame
from . import _patches
from ._compat import run_eagerly, tf, var_handle_id, var_path
from ._locate_sinks import Origin, OriginsAndSinks, _float, _Made, _Phase, _Where
from ._stats import bad_samples, counts, finding_for, is_finite, to_numpy

__all__ = ["Locator", "locate"]

log = logging.getLogger("nanguard")

_ASSIGN = frozenset({"AssignVariableOp", "AssignSubVariableOp", "AssignAddVariableOp"})
_TRAITS: dict[str, OpTraits] = {}  # TF op type -> traits from the core table (cached per type)
on_traits_change(_TRAITS.clear)


def _traits(op_type: str) -> OpTraits:
    t = _TRAITS.get(op_type)
    if t is None:
        t = _TRAITS[op_type] = op_traits(op_type)
    return t











def _kind(t: Any) -> str:
    nan, pinf, ninf = counts(t)
    if nan:
        return "nan"
    return "-inf" if ninf and not pinf else "inf"


class Locator(OriginsAndSinks):
    """Op callback + gradient hook + provenance; see the module docstring.

    ``on_sink``: ``"raise"`` raises :class:`NonFiniteError` at the first sink (``locate()``,
    ``nanguard run --trace``); ``"record"`` keeps going and collects :attr:`findings` (the
    replay). ``intercepts_apply``: an optimizer update is recorded as the optimizer phase but not
    applied (the replay never changes the weights).
    """

    def __init__(
        self,
        *,
        on_sink: str = "raise",
        step: int | None = None,
        detected_by: str = "trace",
        intercepts_apply: bool = False,
    ) -> None:
        if on_sink not in ("raise", "record"):
            raise ValueError("on_sink must be 'raise' or 'record'")
        self.on_sink = on_sink
        self.step = step
        self.detected_by = detected_by
        self.intercepts_apply = intercepts_apply
        self.findings: list[Finding] = []
        self.activation_scale: list[tuple[str, float]] = []
        self.applied: list[Any] = []  # optimizers whose update the replay intercepted
        self.errors: list[str] = []
        self._tracked: dict[int, Origin] = {}
        self.made = _Made()
        self._layers: list[tuple[Any, str]] = []
        self._bwd: list[tuple[_Where | None, str | None]] = []
        self._var_names: dict[int, str] = {}
        self._slot_ids: set[int] = set()
        self.state = _Phase()
        self._orig_grad_fn: Any = None
        self._active = False
        self._last_exit: tuple[Any, str] | None = None

    # --- what the locator knows ----------------------------------------------------------------
    def add_variables(self, variables: Sequence[Any], slots: bool = False) -> None:
        """Name the variables whose reads and writes the locator may meet."""
        for v in variables:
            hid = var_handle_id(v)
            if hid is not None:
                self._var_names.setdefault(hid, var_path(v))
                if slots:
                    self._slot_ids.add(hid)

    def register_batch(self, items: Sequence[tuple[str, Any]]) -> None:
        """The step's input tensors: a non-finite one is an origin of kind ``data``."""
        for name, t in items:
            if not _float(t) or is_finite(t):
                continue
            f = finding_for(
                t,
                "data",
                "input",
                step=self.step,
                detected_by=self.detected_by,
                details={"origin": "data", "input_name": name, "samples": bad_samples(t)},
            )
            self._tracked[t._id] = Origin(f)

    # --- lifecycle ------------------------------------------------------------------------------
    def __enter__(self) -> Locator:
        from tensorflow.python import pywrap_tfe
        from tensorflow.python.eager import backprop
        from tensorflow.python.framework import op_callbacks

        if _patches.LOCATOR is not None:
            raise RuntimeError("a nanguard locator is already active")
        _patches.install()
        _patches.LOCATOR = self
        self._orig_grad_fn = backprop._gradient_function
        pywrap_tfe.TFE_Py_RegisterGradientFunction(self._gradient_function)
        op_callbacks.add_op_callback(self._callback)
        self._active = True
        return self

    def __exit__(self, *exc: object) -> None:
        from tensorflow.python import pywrap_tfe
        from tensorflow.python.framework import op_callbacks

        if not self._active:
            return
        self._active = False
        op_callbacks.remove_op_callback(self._callback)
        pywrap_tfe.TFE_Py_RegisterGradientFunction(self._orig_grad_fn)
        _patches.LOCATOR = None
        _patches.uninstall()

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """Ops run by nanguard itself (the watch tier's check) are not the user's."""
        self.state.quiet += 1
        try:
            yield
        finally:
            self.state.quiet -= 1

    @contextlib.contextmanager
    def loud(self) -> Iterator[None]:
        q, self.state.quiet = self.state.quiet, 0
        try:
            yield
        finally:
            self.state.quiet = q

    @contextlib.contextmanager
    def optimizer_phase(self, opt: Any) -> Iterator[None]:
        """The optimizer's update: its ops are the optimizer phase; its writes are sinks."""
        self.add_variables(getattr(opt, "variables", []), slots=True)
        self.state.opt_depth += 1
        try:
            yield
        finally:
            self.state.opt_depth -= 1
            if not self.state.opt_depth:
                self._end_of_step()

    def _end_of_step(self) -> None:
        self.state.after_backward = False
        self.made.fwd_out.clear()
        self.made.fwd_in.clear()
        self.made.bwd_out.clear()
        if self.step is not None and self.detected_by == "trace":
            self.step += 1

    # --- phase and place --------------------------------------------------------------------------
    def phase(self) -> str:
        if self._bwd or self.state.in_backward:
            return "backward"
        if self.state.opt_depth or self.state.after_backward:
            return "optimizer"
        return "forward"

    def _layer_path(self) -> tuple[str | None, str | None]:
        if not self._layers:
            return None, None
        layer, path = self._layers[-1]
        return path, type(layer).__name__

    def _where(self, phase: str, inputs: Sequence[Any] = ()) -> _Where:
        if phase == "backward" and self._bwd:
            rec, gname = self._bwd[-1]
            if rec is not None:
                return _Where(rec.path, rec.typ, rec.source, rec.code, gname)
            return _Where(None, None, None, None, gname)
        if phase == "backward":
            # the tape's own ops (AddN summing the gradients of a tensor used several times):
            # where the gradients they combine were made
            for t in inputs:
                w = self.made.bwd_out.get(getattr(t, "_id", -1))
                if w is not None:
                    return _Where(w.path, w.typ, w.source, w.code, None)
        path, typ = self._layer_path()
        loc: SourceLocation | None = user_frame(2)
        return _Where(path, typ, loc.short if loc else None, loc.code if loc else None)

    # --- layer stack (from the Layer.__call__ hook) -----------------------------------------------
    def enter_layer(self, layer: Any) -> None:
        if not self._layers and self.state.after_backward and not self.state.in_backward:
            self._end_of_step()  # a new forward pass begins
        parent = self._layers[-1][1] if self._layers else None
        path = f"{parent}/{layer.name}" if parent else str(layer.name)
        self._layers.append((layer, path))
        own = list(getattr(layer, "_trainable_variables", [])) + list(
            getattr(layer, "_non_trainable_variables", [])
        )
        if own:
            self.add_variables(own)

    def exit_layer(self, layer: Any) -> None:
        if self._layers and self._layers[-1][0] is layer:
            self._last_exit = self._layers.pop()

    def layer_output(self, layer: Any, out: Any) -> None:
        """Evidence for bad initialization: the output scale of each layer with weights."""
        if self.phase() != "forward" or not getattr(layer, "_trainable_variables", None):
            return
        if len(self.activation_scale) >= 64 or self.state.busy:
            return
        path = self._last_exit[1] if self._last_exit is not None else str(layer.name)
        self.state.busy = True
        try:
            best = 0.0
            for t in tf.nest.flatten(out):
                if _float(t):
                    a = to_numpy(t)
                    fin = np.abs(a[np.isfinite(a)])
                    if fin.size:
                        best = max(best, float(fin.max()))
                    if not np.isfinite(a).all():
                        best = float("inf")
            self.activation_scale.append((path, best))
        except Exception:  # a layer output nanguard cannot read: no scale for it
            log.debug("nanguard: cannot read a layer's output scale", exc_info=True)
        finally:
            self.state.busy = False

    # --- the backward link -------------------------------------------------------------------------
    def _gradient_function(
        self,
        op_name: str,
        attr_tuple: Any,
        num_inputs: int,
        inputs: Any,
        outputs: Any,
        out_grads: Any,
        skip_input_indices: Any,
        forward_pass_name_scope: Any,
    ) -> Any:
        if isinstance(op_name, bytes):
            op_name = op_name.decode()
        rec: _Where | None = None
        for o in outputs or ():
            if o is not None and hasattr(o, "_id") and o._id in self.made.fwd_out:
                rec = self.made.fwd_out[o._id]
                break
        if rec is None and inputs:
            key = (op_name, *(getattr(i, "_id", None) for i in inputs))
            rec = self.made.fwd_in.get(key)
        gname: str | None = None
        try:
            from tensorflow.python.framework import ops

            fn = ops._gradient_registry.lookup(op_name)
            gname = getattr(fn, "__name__", None)
        except Exception:  # no registered gradient function: named after the op
            log.debug("nanguard: no gradient function for %s", op_name, exc_info=True)
            gname = None
        self._bwd.append((rec, gname or f"{op_name}Grad"))
        try:
            return self._orig_grad_fn(
                op_name, attr_tuple, num_inputs, inputs, outputs, out_grads,
                skip_input_indices, forward_pass_name_scope,
            )
        finally:
            self._bwd.pop()

    # --- the op callback ---------------------------------------------------------------------------
    def _callback(
        self,
        op_type: str,
        inputs: Any,
        attrs: Any,
        outputs: Any,
        op_name: str | None = None,
        graph: Any = None,
    ) -> None:
        if graph is not None or self.state.busy or self.state.quiet or not self._active:
            return None
        if isinstance(op_type, bytes):  # some eager fast paths pass the op type as bytes
            op_type = op_type.decode()
        self.state.busy = True
        try:
            self._on_op(op_type, tuple(inputs or ()), attrs, tuple(outputs or ()))
        finally:
            self.state.busy = False
        return None

    def _on_op(self, op_type: str, inputs: tuple[Any, ...], attrs: Any, outputs: tuple[Any, ...]) -> None:
        phase = self.phase()
        where: _Where | None = None
        if phase == "forward" and outputs:
            where = self._where(phase)
            for o in outputs:
                if hasattr(o, "_id"):
                    self.made.fwd_out[o._id] = where
            key = (op_type, *(getattr(i, "_id", None) for i in inputs))
            self.made.fwd_in[key] = where
        for o in outputs:
            if hasattr(o, "_id"):
                self.made.producer[o._id] = op_type
        if phase == "backward" and outputs:
            w_b = self._where(phase, inputs)
            if w_b.path is not None:
                for o in outputs:
                    if hasattr(o, "_id"):
                        self.made.bwd_out[o._id] = w_b

        if op_type in _ASSIGN and phase == "optimizer" and len(inputs) >= 2:
            self._check_write(op_type, inputs, phase)

        bad = [o for o in outputs if _float(o) and not is_finite(o)]
        inherited: Origin | None = None
        for t in inputs:
            o = self._tracked.get(getattr(t, "_id", -1))
            if o is not None and (inherited is None or o.seq < inherited.seq):
                inherited = o
        if not bad:
            if inherited is not None:
                self._laundered(op_type, outputs, inherited, phase, where)
            return
        constant: str | None = None
        if inherited is None:
            if op_type == "ReadVariableOp" and inputs:
                inherited = self._parameter_origin(inputs[0], bad[0], phase)
            else:
                for t in inputs:
                    if not _float(t) or is_finite(t):
                        continue
                    n = int(np.prod(t.shape)) if t.shape.rank is not None else 0
                    if n <= 1 or not counts(t)[0]:  # a literal, or a mask of +-inf
                        constant = _kind(t)
                        continue
                    inherited = self._outside_origin(t, phase)
                    break
        if inherited is None:
            where = where or self._where(phase, inputs)
            inherited = self._new_origin(op_type, inputs, attrs, bad[0], phase, where)
            if constant is not None:
                inherited.deliberate = True
                inherited.finding.details["constant"] = constant
        f = inherited.finding
        if f.phase == "data" and f.module is None and f.source is None:
            w = where or self._where(phase)
            f.module, f.module_type, f.source, f.source_code = w.path, w.typ, w.source, w.code
        for o in bad:
            self._tracked[o._id] = inherited
        if phase == "forward" and _traits(op_type).relu:
            # early TensorFlow wrapped the forward output of every ReLU in a check_numerics when
            # it built ReluGrad: the last ReLU a non-finite value passes is the first ReluGrad of
            # the backward pass, where "ReluGrad input is not finite" fired
            w = where or self._where(phase)
            place = f"`{w.path}` ({w.typ})" if w.path else "a ReLU"
            inherited.relu_note = (
                f"TensorFlow's old `ReluGrad input is not finite` would have fired at {place}"
                + (f", {w.source}" if w.source else "")
                + ", in the backward pass"
            )
            inherited.relu_layer = place



    # --- origins ------------------------------------------------------------------------------------



    # --- sinks --------------------------------------------------------------------------------------











@contextlib.contextmanager
def locate(*, step: int | None = None) -> Iterator[Locator]:
    """Trace a block op by op; raise :class:`~nanguard.NonFiniteError` at the origin of the first
    non-finite value that reaches a loss (``tape.gradient``), a gradient or a weight.

    Every ``tf.function`` inside runs eagerly for the duration (the op callback only sees eager
    ops), so this is the slow, exact tier::

        with nanguard.keras.locate():
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)   # raises here, at the origin
    """
    loc = Locator(on_sink="raise", step=step, detected_by="trace")
    with run_eagerly(), loc:
        yield loc
