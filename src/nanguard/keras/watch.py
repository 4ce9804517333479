"""The watch tier for Keras: a check traced into the training step, next to the optimizer update.

When the step is traced (``model.fit``'s train function, a user's ``tf.function``) or run eagerly,
``optimizer.apply(grads, variables)`` goes through :func:`guarded_apply`, which adds to the graph:

* one squared norm per gradient (``l2_loss``, one pass each) and the sum of the step's loss
  (the target of ``GradientTape.gradient``): finite iff every value is finite — only when that sum
  overflows does an exact ``is_finite`` pass decide;
* a ``tf.cond`` around the update: finite → the optimizer's own ``apply`` (with the learning rate
  multiplied by the guard's back-off factor, the guard's clipping and epsilon when switched on),
  then a copy of the small non-trainable state (BatchNorm statistics, dropout seeds, metrics) and
  the squared norm of the updated weights; non-finite → no update at all, the non-trainable state
  is put back as it was before the step;
* one ``assign`` of a small float64 vector (:class:`GuardState.stats`) that the Python side reads
  once per step — the only host synchronisation nanguard adds.

Nothing here decides anything: the adapter reads :class:`StepStats` after the step and replays,
diagnoses and applies the policy in Python.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._compat import float_tensors, tf, values_of, var_path

__all__ = ["GuardState", "StepStats", "clear_losses", "guarded_apply", "record_loss"]

_F64 = tf.float64
_LOW = (tf.float16, tf.bfloat16)

# slots of GuardState.stats (then one squared norm per gradient)
_COUNT, _APPLIED, _GFIN, _LFIN, _LOSS, _HASLOSS, _GSQ, _LR, _PFIN, _PSQ = range(10)
_HEAD = 10


# ----------------------------------------------------------------------------------------------
# the step's loss: the target of GradientTape.gradient (recorded by the patch in _patches.py)

_pending = threading.local()


def record_loss(target: Any) -> None:
    """Called by the ``GradientTape.gradient`` patch with its target (at trace time in a graph)."""
    items = getattr(_pending, "items", None)
    if items is None:
        items = _pending.items = []
    for t in tf.nest.flatten(target):
        if isinstance(t, tf.Tensor) and t.dtype.is_floating:
            items.append(t)
    del items[:-8]  # a tape used without an optimizer step must not grow this forever


def clear_losses() -> None:
    """Forget the losses recorded since the last update (a replay intercepts its update: its
    eager loss must not be taken by the next real one)."""
    _pending.items = []


def _take_losses() -> list[Any]:
    items: list[Any] = getattr(_pending, "items", None) or []
    _pending.items = []
    if tf.executing_eagerly():
        return [t for t in items if isinstance(t, tf.__internal__.EagerTensor)]
    graphs = []
    g: Any = tf.compat.v1.get_default_graph()
    while g is not None:  # this graph and those it is nested in (a LossScaleOptimizer's cond)
        graphs.append(g)
        g = getattr(g, "outer_graph", None)
    out = []
    for t in items:
        try:
            if not isinstance(t, tf.__internal__.EagerTensor) and any(t.graph is gr for gr in graphs):
                out.append(t)
        except AttributeError:
            continue
    return out


# ----------------------------------------------------------------------------------------------


@dataclass
class StepStats:
    """What one guarded update looked like, read with one ``numpy()``."""

    count: int
    applied: bool
    grads_finite: bool
    loss_finite: bool
    loss: float | None
    grad_norm: float
    lr: float | None
    params_finite: bool
    param_norm: float | None
    grad_norms: list[float] = field(default_factory=list)

    @property
    def finite(self) -> bool:
        return self.grads_finite and self.loss_finite


class GuardState:
    """The variables one guarded optimizer's traced step writes and reads.

    Created eagerly (or lifted out of a trace with ``tf.init_scope``). ``lr_scale`` multiplies the
    optimizer's learning rate at every step (a schedule included); ``clip`` > 0 clips gradients
    by their global norm before the update; ``eps`` replaces a float ``epsilon`` of the optimizer
    (so a recovery can raise it without a retrace).
    """

    def __init__(self, optimizer: Any, state_vars: Sequence[Any] = (), metric_vars: Sequence[Any] = ()) -> None:
        self.optimizer = optimizer
        self.stats: Any = None  # made when the update is traced: its length depends on it
        with tf.init_scope():
            self.lr_scale = tf.Variable(1.0, dtype=tf.float32, trainable=False, name="nanguard_lr_scale")
            self.clip = tf.Variable(0.0, dtype=tf.float32, trainable=False, name="nanguard_clip")
            eps = getattr(optimizer, "epsilon", None)
            self.eps: Any = None
            if isinstance(eps, (int, float)) and not isinstance(eps, bool):
                self.eps = tf.Variable(float(eps), dtype=tf.float32, trainable=False, name="nanguard_eps")
        self.state_vars: list[Any] = []
        self.backups: list[Any] = []
        self.metric_vars: list[Any] = []
        self.metric_backups: list[Any] = []
        self.set_state(state_vars, metric_vars, force=True)
        self.var_names: list[str] = []
        self.var_refs: list[Any] = []
        self.slot_refs: list[Any] = []
        self.n_params = 0
        self.wrapper: Any = None  # the LossScaleOptimizer around ``optimizer``, if any
        #: called when an update is traced (or run eagerly), before it: the first snapshot
        self.on_trace: Callable[[Any, list[Any]], None] | None = None
        self.traced = 0
        self.last_count = 0
        self.dtype_noted = False  # the early warnings know whether its variables are float16

    def set_state(self, state_vars: Sequence[Any], metric_vars: Sequence[Any] = (), force: bool = False) -> None:
        """The small non-trainable state kept as it was before a skipped step."""
        same = [id(v) for v in state_vars] == [id(v) for v in self.state_vars] and [
            id(v) for v in metric_vars
        ] == [id(v) for v in self.metric_vars]
        if same and not force:
            return  # a step traced earlier writes to these backups: keep them
        with tf.init_scope():
            self.state_vars = list(state_vars)
            self.backups = [_backup(v) for v in self.state_vars]
            self.metric_vars = list(metric_vars)
            self.metric_backups = [_backup(v) for v in self.metric_vars]

    def stats_for(self, n_grads: int) -> Any:
        """The stats vector for an update of ``n_grads`` gradients (a fixed shape: XLA wants
        one). Made outside the trace, as Keras makes an optimizer's variables."""
        size = _HEAD + n_grads
        if self.stats is None or int(self.stats.shape[0]) != size:
            count = float(self.stats.numpy()[_COUNT]) if self.stats is not None else 0.0
            with tf.init_scope():
                init = tf.concat([tf.constant([count], _F64), tf.zeros([size - 1], _F64)], axis=0)
                self.stats = tf.Variable(init, trainable=False, name="nanguard_stats")
        return self.stats

    def read(self) -> StepStats:
        """One host transfer: the numbers of the last guarded update."""
        if self.stats is None:
            return StepStats(0, False, True, True, None, float("nan"), None, True, None)
        a = self.stats.numpy()
        n = len(a)

        def f(i: int) -> float:
            return float(a[i]) if i < n else 0.0

        has_loss = f(_HASLOSS) > 0
        loss = f(_LOSS) if has_loss else None
        pn = f(_PSQ)
        return StepStats(
            count=int(f(_COUNT)),
            applied=f(_APPLIED) > 0,
            grads_finite=f(_GFIN) > 0,
            loss_finite=f(_LFIN) > 0,
            loss=loss,
            grad_norm=math.sqrt(f(_GSQ)) if math.isfinite(f(_GSQ)) and f(_GSQ) >= 0 else float("nan"),
            lr=f(_LR) if math.isfinite(f(_LR)) else None,
            params_finite=f(_PFIN) > 0,
            param_norm=math.sqrt(pn) if f(_APPLIED) > 0 and math.isfinite(pn) and pn >= 0 else None,
            grad_norms=[math.sqrt(x) if x >= 0 and math.isfinite(x) else float(x) for x in a[_HEAD:].tolist()],
        )

    def restore_metrics(self) -> list[str]:
        """Put back the metrics a skipped step made non-finite (from the last healthy step)."""
        fixed = []
        for v, b in zip(self.metric_vars, self.metric_backups):
            val = v.numpy()
            if np.issubdtype(val.dtype, np.floating) and not np.isfinite(val).all():
                v.assign(b.numpy())
                fixed.append(var_path(v))
        return fixed

    def restore_state(self) -> None:
        """Non-trainable state back to the copy taken after the last healthy update."""
        for v, b in zip(self.state_vars, self.backups):
            v.assign(b.numpy())

    def refresh_backups(self, metrics: bool = False) -> None:
        """Copy the current non-trainable state (after a rollback restored it, at the start of
        a fit) and, with ``metrics``, the metrics (after Keras reset them for a new epoch)."""
        for v, b in zip(self.state_vars, self.backups):
            b.assign(v.numpy())
        if metrics:
            for v, b in zip(self.metric_vars, self.metric_backups):
                b.assign(v.numpy())


def _value(v: Any) -> Any:
    return v.value if hasattr(v, "value") else v


def _is_float_var(v: Any) -> bool:
    dt = getattr(v, "dtype", None)
    name = dt if isinstance(dt, str) else getattr(dt, "name", "")
    return str(name).startswith(("float", "bfloat"))


def _backup(v: Any) -> Any:
    return tf.Variable(v.numpy(), trainable=False, dtype=v.dtype, shape=v.shape)


# ----------------------------------------------------------------------------------------------
# graph pieces


def _sq(t: Any) -> Any:
    v = values_of(t)
    if v.dtype in _LOW:
        v = tf.cast(v, tf.float32)
    return tf.cast(tf.nn.l2_loss(v), _F64) * 2.0


def _sq_exact(t: Any) -> Any:
    return tf.reduce_sum(tf.square(tf.cast(values_of(t), _F64)))


def _all_finite(t: Any) -> Any:
    return tf.reduce_all(tf.math.is_finite(values_of(t)))


def sq_norms(ts: Sequence[Any]) -> tuple[Any, Any]:
    """(all finite, squared norm of each): one ``l2_loss`` per tensor; an exact pass only when
    the float32 sum is not finite (a non-finite value, or finite values too large to square)."""
    if not ts:
        return tf.constant(True), tf.zeros([0], _F64)
    fast = tf.stack([_sq(t) for t in ts])
    total = tf.reduce_sum(fast)

    def quick() -> tuple[Any, Any]:
        return tf.constant(True), fast

    def exact() -> tuple[Any, Any]:
        fin = tf.reduce_all(tf.stack([_all_finite(t) for t in ts]))
        return fin, tf.stack([_sq_exact(t) for t in ts])

    ok, per = tf.cond(tf.math.is_finite(total), quick, exact)
    return ok, per


def _loss_check(losses: Sequence[Any]) -> tuple[Any, Any, Any]:
    if not losses:
        return tf.constant(True), tf.constant(0.0, _F64), tf.constant(0.0, _F64)
    total = tf.add_n([tf.reduce_sum(tf.cast(t, _F64)) for t in losses])
    return tf.math.is_finite(total), total, tf.constant(1.0, _F64)


@contextlib.contextmanager
def _swapped(opt: Any, lr: Any, eps: Any) -> Iterator[None]:
    """The optimizer reads the guard's learning rate (and epsilon) while its update is traced.

    ``object.__setattr__`` bypasses Keras' attribute tracking; both are put back at once."""
    old_lr = opt.__dict__.get("_learning_rate")
    old_eps = opt.__dict__.get("epsilon", None)
    object.__setattr__(opt, "_learning_rate", lambda: lr)
    if eps is not None:
        object.__setattr__(opt, "epsilon", eps)
    try:
        yield
    finally:
        object.__setattr__(opt, "_learning_rate", old_lr)
        if eps is not None:
            object.__setattr__(opt, "epsilon", old_eps)


def _prepare(state: GuardState, opt: Any, grads: list[Any], trainable_variables: Sequence[Any] | None
             ) -> tuple[list[Any], list[tuple[int, Any, Any]], list[Any]]:
    """While the step is traced: build the optimizer if needed (eagerly), take the first
    snapshot, and note which variables and slots this update writes. Returns the variables, the
    ``(index, gradient, variable)`` pairs with a gradient, and the optimizer's slots."""
    from keras.src import backend as kbackend

    if trainable_variables is None:
        tv = list(opt._trainable_variables)
    else:
        tv = list(trainable_variables)
        if not opt.built:
            # built eagerly, as Keras' trainer does before tracing: created inside the trace, the
            # optimizer's variables would only be initialized when the step first runs
            with tf.init_scope(), kbackend.name_scope(opt.name, caller=opt):
                opt.build(tv)
            opt.built = True
    pairs = [(i, g, v) for i, (g, v) in enumerate(zip(grads, tv)) if g is not None]
    vl = [v for _, _, v in pairs]
    if state.on_trace is not None:
        with tf.init_scope():  # eager, outside the trace: the values before the first update
            state.on_trace(opt, tv)
    state.var_names = [var_path(v) for v in vl]
    state.var_refs = list(vl)
    state.n_params = sum(int(np.prod(v.shape)) for v in vl)
    in_vl = {id(v) for v in vl}
    slots = [v for v in getattr(opt, "variables", []) if id(v) not in in_vl and _is_float_var(v)
             and "learning_rate" not in var_path(v)]
    state.slot_refs = slots
    state.traced += 1
    return tv, pairs, slots


def guarded_apply(
    state: GuardState,
    orig: Callable[..., Any],
    opt: Any,
    grads: Sequence[Any],
    trainable_variables: Sequence[Any] | None,
) -> Any:
    """``optimizer.apply`` with the check and the conditional update (see the module docstring)."""
    grads = list(grads)
    if not grads:
        return orig(opt, grads, trainable_variables)
    tv, pairs, slots = _prepare(state, opt, grads, trainable_variables)
    gl = [g for _, g, _ in pairs]
    vl = [v for _, _, v in pairs]
    losses = _take_losses()

    g_fin, g_sq = sq_norms(float_tensors(gl))
    l_fin, l_val, has_loss = _loss_check(losses)
    scale = getattr(state.wrapper, "dynamic_scale", None)
    if scale is not None and losses:  # a LossScaleOptimizer's scaled loss: record the real one
        l_val = l_val / tf.cast(scale, _F64)
    ok = tf.logical_and(g_fin, l_fin)
    lr_eff = tf.cast(opt.learning_rate, tf.float32) * state.lr_scale
    eps = state.eps if state.eps is not None and all(v.dtype == "float32" for v in vl) else None

    def do() -> tuple[Any, Any, Any]:
        clipped = _clip(gl, state.clip, g_sq)
        full: list[Any] = list(grads)
        for (i, _, _), g in zip(pairs, clipped):
            full[i] = g
        with _swapped(opt, lr_eff, eps):
            orig(opt, full, tv if trainable_variables is not None else None)
        for v, b in zip(state.state_vars, state.backups):
            b.assign(v)
        for v, b in zip(state.metric_vars, state.metric_backups):
            b.assign(v)
        p_fin, p_sq = sq_norms(float_tensors([_value(v) for v in vl]))
        if slots:  # the optimizer's own state (momentum, second moment) must stay finite too
            s_fin, _ = sq_norms(float_tensors([_value(v) for v in slots]))
            p_fin = tf.logical_and(p_fin, s_fin)
        return tf.constant(1.0, _F64), p_fin, tf.reduce_sum(p_sq)

    def skip() -> tuple[Any, Any, Any]:
        for v, b in zip(state.state_vars, state.backups):
            v.assign(b)
        return tf.constant(0.0, _F64), tf.constant(True), tf.constant(0.0, _F64)

    applied, p_fin, p_sq = tf.cond(ok, do, skip)
    stats = state.stats_for(int(g_sq.shape[0]))
    head = tf.stack(
        [
            stats[_COUNT] + 1.0,
            applied,
            tf.cast(g_fin, _F64),
            tf.cast(l_fin, _F64),
            l_val,
            has_loss,
            tf.reduce_sum(g_sq),
            tf.cast(lr_eff, _F64),
            tf.cast(p_fin, _F64),
            p_sq,
        ]
    )
    stats.assign(tf.concat([head, g_sq], axis=0))
    return None


def _clip(gl: list[Any], clip: Any, g_sq: Any) -> list[Any]:
    """Clip by the global norm when the guard switched clipping on (``clip`` > 0). The norm is
    the one the check already computed (float64); each gradient keeps its own dtype."""

    def on() -> list[Any]:
        norm = tf.sqrt(tf.reduce_sum(g_sq))
        c = tf.cast(clip, _F64)
        scale = c / tf.maximum(norm, c)
        out = []
        for g in gl:
            if isinstance(g, tf.IndexedSlices):
                out.append(tf.IndexedSlices(g.values * tf.cast(scale, g.values.dtype), g.indices, g.dense_shape))
            else:
                out.append(g * tf.cast(scale, g.dtype))
        return out

    def off() -> list[Any]:
        return [g if isinstance(g, tf.IndexedSlices) else tf.identity(g) for g in gl]

    out = tf.cond(clip > 0, on, off)
    return list(out)
