"""``nanguard.keras.NanGuard``: the Keras callback for ``model.fit``.

It does its work around each training step rather than in ``on_train_batch_end``: at
``on_train_begin`` it replaces the model's train function (for this fit only) with one that takes
the next batch from the iterator in Python, runs Keras' own compiled step on it, and then checks
the step (:meth:`KerasGuard.after_step`). So a non-finite update is never applied, the batch is at
hand for the replay, and callbacks that run after the step (the progress bar, ``TerminateOnNaN``,
``ModelCheckpoint``) already see the logs of a skipped or rolled-back step put right.
"""

from __future__ import annotations

from typing import Any

from . import _patches
from ._compat import keras, tf
from .guard import KerasGuard
from .replay import flatten_batch

__all__ = ["NanGuard"]


def _autoconvert(data: Any) -> Any:
    """As Keras' ``_autoconvert_optionals``: ``tf.experimental.Optional`` inputs become None."""
    return tf.nest.map_structure(
        lambda i: None if isinstance(i, tf.experimental.Optional) else i, data
    )


def _optimizers_of(model: Any) -> list[Any]:
    """``model.optimizer`` and any other optimizer the model holds (a GAN's custom train_step)."""
    found: list[Any] = []
    opt = getattr(model, "optimizer", None)
    if isinstance(opt, keras.optimizers.Optimizer):
        found.append(opt)
    for v in vars(model).values():
        if isinstance(v, keras.optimizers.Optimizer) and all(v is not o for o in found):
            found.append(v)
    return found


class NanGuard(keras.callbacks.Callback):
    """Catch the first NaN/Inf of ``model.fit`` at the op that made it; explain it; survive it.

    ::

        model.fit(x, y, epochs=10, callbacks=[nanguard.keras.NanGuard(policy="recover")])

    Each step's loss and gradients are checked inside the compiled step, next to the update; a
    non-finite step is never applied. Its batch is then replayed eagerly under TensorFlow's op
    callbacks to name the op, the layer path (``sequential/dense_2``), the phase and the source
    line; the cause is diagnosed from the run's history and ``policy`` decides: ``"raise"``
    (:class:`~nanguard.NonFiniteError` out of ``fit``), ``"skip"`` or ``"recover"`` (roll back
    weights and optimizer state, back off the learning rate, clip gradients, drop a poisoned
    batch). The other arguments are those of :func:`nanguard.keras.attach`.

    Attributes: :attr:`guard` (the :class:`KerasGuard`: ``history``, ``findings``,
    ``recoveries``, ``report()``).
    """

    def __init__(
        self,
        policy: str = "raise",
        *,
        replay: bool = True,
        max_consecutive_skips: int = 10,
        lr_factor: float = 0.5,
        max_recoveries: int = 5,
        recovery_window: int = 1000,
        snapshot_every: int = 50,
        on_unfixable: str = "raise",
        guard: KerasGuard | None = None,
    ) -> None:
        super().__init__()
        self.guard = guard if guard is not None else KerasGuard(
            policy=policy,
            replay=replay,
            max_consecutive_skips=max_consecutive_skips,
            lr_factor=lr_factor,
            max_recoveries=max_recoveries,
            recovery_window=recovery_window,
            snapshot_every=snapshot_every,
            on_unfixable=on_unfixable,
        )
        self._owns_guard = guard is None
        self._saved: tuple[Any, Any, list[int]] | None = None  # (model, guarded function, optimizers)
        self._active_model: Any = None

    # --- convenience -------------------------------------------------------------------------------
    @property
    def findings(self) -> list[Any]:
        return self.guard.findings

    @property
    def recoveries(self) -> list[dict[str, Any]]:
        return self.guard.recoveries

    @property
    def history(self) -> Any:  # the guard's, not keras' History callback
        return self.guard.history

    def report(self) -> str:
        return self.guard.report()

    # --- keras hooks -------------------------------------------------------------------------------
    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        model = self.model
        self.guard.install()
        self.guard.bind(model, _optimizers_of(model))
        opts = _optimizers_of(model)
        if self._saved is not None and self._saved[0] is model and self._saved[2] == [id(o) for o in opts]:
            model.train_function = self._saved[1]  # same model, optimizer and guard: still valid
            self._active_model = model
            return
        # trace afresh with the guarded update (an earlier trace would not contain the check)
        model.make_train_function(force=True)
        inner = model.train_function
        model.train_function = self._wrap(model, inner)
        self._saved = (model, model.train_function, [id(o) for o in opts])
        self._active_model = model

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        # keras has just reset the metrics: a skipped step restores them from this state
        for st in self.guard.states():
            st.refresh_backups(metrics=True)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._owns_guard:  # what nanguard run prints at the end: the events, the verdict
            self.guard.training_ended()
        self._teardown()

    def _teardown(self) -> None:
        model = self._active_model
        if model is not None:
            # keras builds a fresh (unguarded) train function for the next fit without us
            model.train_function = None
            self._active_model = None
        if self._owns_guard:
            self.guard.detach()

    def _wrap(self, model: Any, inner: Any) -> Any:
        guard = self.guard

        def step_once(data: Any) -> Any:
            with _patches.in_step():
                logs = inner([data])
            try:
                status = guard.after_step(
                    lambda: ((lambda: model.train_step(_autoconvert(data))), flatten_batch(_autoconvert(data)))
                )
            except BaseException:
                self._teardown()
                raise
            if status == "skipped":
                logs = model.get_metrics_result()  # the metrics as the skipped step left them
            return logs

        def train_function(iterator: Any) -> Any:
            logs = None
            for k in range(max(1, int(getattr(model, "steps_per_execution", 1) or 1))):
                try:
                    data = iterator.get_next() if hasattr(iterator, "get_next") else next(iterator)
                except (StopIteration, tf.errors.OutOfRangeError):
                    if k == 0:
                        raise StopIteration from None
                    break
                logs = step_once(data)
            return logs

        return train_function

