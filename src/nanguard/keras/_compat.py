"""The one place that imports TensorFlow and Keras, checks their versions, and holds the small
helpers every other module of the adapter needs.

``nanguard.keras`` needs Keras 3 running on the TensorFlow backend. Anything else raises
:class:`ImportError` with the reason, so ``nanguard run`` (which catches it) leaves such scripts
alone and ``import nanguard`` never needs TensorFlow.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

import keras
import tensorflow as tf

from ..core.source import skip_dir

__all__ = [
    "keras",
    "run_eagerly",
    "tf",
    "unwrap_optimizer",
    "values_of",
    "var_handle_id",
    "var_path",
]

if int(keras.__version__.split(".")[0]) < 3:  # pragma: no cover - guarded by the tf extra
    raise ImportError(f"nanguard.keras needs Keras 3, found keras {keras.__version__}")
if keras.backend.backend() != "tensorflow":
    raise ImportError(
        f"nanguard.keras needs the TensorFlow backend of Keras 3; KERAS_BACKEND is "
        f"{keras.backend.backend()!r}"
    )

skip_dir(os.path.dirname(tf.__file__))
skip_dir(os.path.dirname(keras.__file__))
for _name in ("keras", "tensorflow", "tf_keras", "absl", "optree"):
    _mod = __import__("sys").modules.get(_name)
    if _mod is not None and getattr(_mod, "__file__", None):
        skip_dir(os.path.dirname(_mod.__file__))


def values_of(t: Any) -> Any:
    """The dense values of a gradient: ``IndexedSlices`` (embeddings) carry theirs in ``.values``."""
    return t.values if isinstance(t, tf.IndexedSlices) else t


def var_path(v: Any) -> str:
    """``sequential/dense_2/kernel`` for a Keras variable, the name for a plain ``tf.Variable``."""
    path = getattr(v, "path", None)
    if isinstance(path, str) and path:
        return path
    name = str(getattr(v, "name", "variable"))
    return name[:-2] if name.endswith(":0") else name


def var_handle_id(v: Any) -> int | None:
    """The tape id of the resource handle a ``ReadVariableOp`` reads ``v`` through."""
    inner = getattr(v, "value", None) if not isinstance(v, tf.Variable) else v
    handle = getattr(inner, "handle", None)
    hid = getattr(handle, "_id", None)
    return int(hid) if isinstance(hid, int) else None


def unwrap_optimizer(opt: Any) -> Any:
    """The optimizer that really updates the weights (inside a ``LossScaleOptimizer``)."""
    inner = getattr(opt, "inner_optimizer", None)
    return inner if inner is not None else opt


def is_float(t: Any) -> bool:
    dt = getattr(t, "dtype", None)
    return bool(getattr(dt, "is_floating", False))


def float_tensors(ts: Sequence[Any]) -> list[Any]:
    return [t for t in ts if t is not None and is_float(values_of(t))]


@contextlib.contextmanager
def run_eagerly() -> Iterator[None]:
    """Run every ``tf.function`` as plain Python for the duration (the replay needs each op)."""
    before = tf.config.functions_run_eagerly()
    tf.config.run_functions_eagerly(True)
    try:
        yield
    finally:
        tf.config.run_functions_eagerly(before)
