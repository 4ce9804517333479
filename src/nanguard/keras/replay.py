"""Replay: run the failing step again, op by op, and leave no trace.

Called only after the watch tier saw a non-finite loss or gradient. By then the traced step has
already skipped its update and put the non-trainable state (BatchNorm statistics, dropout seeds)
back as it was before the step, so running the same Python step function again on the same batch
— eagerly, under the :class:`~nanguard.keras.locate.Locator` — computes the same values. The
optimizer's update is intercepted (the replay never changes a weight) and every variable the
replay may touch (model state, metrics, optimizer state) is restored bit for bit afterwards.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.errors import NonFiniteError
from ..core.finding import Finding
from ._compat import run_eagerly, unwrap_optimizer
from .locate import Locator
from .watch import clear_losses

__all__ = ["HostRng", "replay", "state_variables"]

log = logging.getLogger("nanguard")


def state_variables(model: Any, optimizers: Sequence[Any]) -> list[Any]:
    """Every variable a training step may write: weights, BatchNorm statistics, seeds, metrics,
    optimizer state (a ``LossScaleOptimizer``'s and its inner optimizer's)."""
    out: list[Any] = []
    seen: set[int] = set()

    def add(vs: Any) -> None:
        for v in vs or ():
            if id(v) not in seen:
                seen.add(id(v))
                out.append(v)

    if model is not None:
        add(model.variables)
        add(getattr(model, "metrics_variables", ()))
    for opt in optimizers:
        add(getattr(opt, "variables", ()))
        add(getattr(unwrap_optimizer(opt), "variables", ()))
    try:
        from keras.src.backend.common import global_state

        gen = global_state.get_global_attribute("global_seed_generator")
        if gen is not None:
            add([gen.state])
    except Exception:  # a Keras without a global seed generator
        log.debug("nanguard: no global seed generator", exc_info=True)
    return out


def replay(
    fn: Callable[[], Any],
    *,
    model: Any,
    optimizers: Sequence[Any],
    batch: Sequence[tuple[str, Any]],
    step: int | None,
) -> tuple[Finding | None, dict[str, Any]]:
    """Run ``fn`` (one training step) under the locator; return the first finding and extras
    (``activation_scale``: the output scale of each layer with weights; ``errors``)."""
    variables = state_variables(model, optimizers)
    saved = [(v, v.numpy()) for v in variables]
    loc = Locator(on_sink="record", step=step, detected_by="replay", intercepts_apply=True)
    if model is not None:
        loc.add_variables(model.variables)
    for opt in optimizers:
        loc.add_variables(getattr(unwrap_optimizer(opt), "variables", ()), slots=True)
    loc.register_batch(batch)
    try:
        with run_eagerly(), loc:
            try:
                fn()
            except NonFiniteError:
                pass
            except Exception as exc:  # the step itself may fail on the NaN: keep what was found
                loc.errors.append(f"{type(exc).__name__}: {exc}"[:300])
    finally:
        for v, val in saved:
            v.assign(val)
        clear_losses()
    return loc.first(), {"activation_scale": loc.activation_scale, "errors": loc.errors}


def flatten_batch(data: Any, names: Sequence[str] = ("x", "y", "sample_weight")) -> list[tuple[str, Any]]:
    """``[("x", t), ("y", t), ...]`` for a Keras batch ``(x, y, sample_weight)`` or any nest."""
    import tensorflow as tf

    items: list[tuple[str, Any]] = []
    if isinstance(data, (tuple, list)) and 1 <= len(data) <= 3:
        parts = list(zip(names, data))
    else:
        parts = [("x", data)]
    for name, part in parts:
        if isinstance(part, dict):
            for k, v in part.items():
                for i, t in enumerate(tf.nest.flatten(v)):
                    items.append((f"{name}[{k!r}]" + (f"[{i}]" if i else ""), t))
            continue
        flat = tf.nest.flatten(part)
        for i, t in enumerate(flat):
            items.append((name if len(flat) == 1 else f"{name}[{i}]", t))
    return [(n, t) for n, t in items if hasattr(t, "_id")]


def step_arguments(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any], list[tuple[str, Any]]]:
    """A step function's arguments for its replay: numpy arrays as tensors (so the locator can
    follow them), and the tensors named after the function's parameters (``xb``, ``yb``)."""
    import inspect

    import numpy as np
    import tensorflow as tf

    def conv(a: Any) -> Any:
        return tf.convert_to_tensor(a) if isinstance(a, np.ndarray) else a

    args = tuple(tf.nest.map_structure(conv, list(args))) if args else ()
    kwargs = {k: tf.nest.map_structure(conv, v) for k, v in kwargs.items()}
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
        named = list(bound.arguments.items())
    except (TypeError, ValueError):
        named = [(f"argument {i}", a) for i, a in enumerate(args)] + list(kwargs.items())
    items: list[tuple[str, Any]] = []
    for name, value in named:
        flat = tf.nest.flatten(value)
        for i, t in enumerate(flat):
            if hasattr(t, "_id"):
                items.append((name if len(flat) == 1 else f"{name}[{i}]", t))
    return args, kwargs, items


@dataclass(frozen=True)
class HostRng:
    """The random state a step may draw from outside Keras' seed generators (which are
    variables, restored with the model's): NumPy's and Python's global generators and
    TensorFlow's global ``tf.random.Generator`` (when the script made one). Captured as a custom
    loop's step begins (``guard.wrap``) and put back for its replay — so a mask or a noise drawn
    in the step is drawn again the same, and the replay reproduces what the step computed."""

    numpy: Any
    python: Any
    tf_state: Any = None

    @staticmethod
    def _tf_generator() -> Any:
        try:
            from tensorflow.python.ops import stateful_random_ops
        except ImportError:  # pragma: no cover - a TensorFlow without it
            return None
        return getattr(stateful_random_ops, "global_generator", None)  # None until one is made

    @classmethod
    def capture(cls) -> HostRng:
        import numpy as np

        gen = cls._tf_generator()
        return cls(np.random.get_state(), random.getstate(),
                   gen.state.numpy() if gen is not None else None)

    def restore(self) -> None:
        import numpy as np

        np.random.set_state(self.numpy)
        random.setstate(self.python)
        gen = self._tf_generator()
        if gen is not None and self.tf_state is not None:
            gen.state.assign(self.tf_state)


def replay_of(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], rng: HostRng | None = None,
) -> Callable[[], tuple[Callable[[], Any], list[tuple[str, Any]]]]:
    """What a step driver hands to ``after_step``: prepares the replay of ``fn(*args, **kwargs)``
    only when one is needed — with the host random state of the step's start (``rng``) for the
    replay, and the run's own put back after it."""

    def prepare() -> tuple[Callable[[], Any], list[tuple[str, Any]]]:
        rargs, rkwargs, batch = step_arguments(fn, args, kwargs)

        def again() -> Any:
            if rng is None:
                return fn(*rargs, **rkwargs)
            now = HostRng.capture()
            rng.restore()
            try:
                return fn(*rargs, **rkwargs)
            finally:
                now.restore()  # the run goes on from where it was, as if there were no replay

        return again, batch

    return prepare
