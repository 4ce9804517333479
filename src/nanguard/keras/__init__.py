"""Keras 3 on TensorFlow: the same guard as for PyTorch (``pip install nanguard[tf]``).

* :class:`NanGuard` — a callback for ``model.fit``;
* :func:`attach` / :class:`KerasGuard` — for custom loops (``tf.GradientTape`` +
  ``optimizer.apply_gradients``), with :meth:`KerasGuard.wrap` around the step function;
* :func:`locate` — trace a block op by op and raise at the origin (the slow, exact tier).

Importing this package imports TensorFlow and Keras (never torch); it raises ``ImportError`` when
Keras 3 on the TensorFlow backend is not available.
"""

from ..core.diagnosed import with_diagnosis
from .callback import NanGuard
from .guard import KerasGuard, attach
from .locate import Locator
from .locate import locate as _locate

locate = with_diagnosis(_locate)

__all__ = ["KerasGuard", "Locator", "NanGuard", "attach", "locate"]
