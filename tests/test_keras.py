"""The Keras 3 / TensorFlow adapter: origin, phase, layer path and cause of injected faults;
healthy controls; policies; ``nanguard run`` and the demo.

Small models, one TensorFlow thread, fixed seeds: the whole file runs in well under a minute on
two CPU cores (TensorFlow itself takes ~3 s to import).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "tensorflow":  # pragma: no cover
    pytest.skip("the Keras adapter needs the TensorFlow backend", allow_module_level=True)

import nanguard.keras as nk  # noqa: E402
from _spawn import Spawn  # noqa: E402
from nanguard import Cause, GiveUpError, NonFiniteError  # noqa: E402
from nanguard.keras.snapshot import Snapshotter  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
HERE = Path(__file__).resolve()
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "OMP_NUM_THREADS": "1"}


@pytest.fixture(autouse=True)
def _seeded() -> None:
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)


def _data(n: int = 256, d: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype("float32")
    return x, (x @ rng.standard_normal((d, 1))).astype("float32")


def _mlp(d: int = 8, name: str = "mlp", dropout: bool = False, bn: bool = False) -> Any:
    layers: list[Any] = [keras.Input((d,)), keras.layers.Dense(16, activation="relu", name="fc1")]
    if bn:
        layers.append(keras.layers.BatchNormalization(name="bn"))
    if dropout:
        layers.append(keras.layers.Dropout(0.2, name="drop"))
    layers.append(keras.layers.Dense(1, name="head"))
    return keras.Sequential(layers, name=name)


def _values(model: Any, opt: Any) -> list[np.ndarray]:
    return [np.array(v.numpy()) for v in list(model.variables) + list(opt.variables)]


def _all_finite(model: Any, opt: Any) -> bool:
    return all(
        np.isfinite(v).all() for v in _values(model, opt) if np.issubdtype(v.dtype, np.floating)
    )


class LogLayer(keras.layers.Layer):
    def call(self, x: Any) -> Any:
        return tf.math.log(x)  # log(0) = -inf where a ReLU gave 0


class Distance(keras.layers.Layer):
    def call(self, a: Any) -> Any:
        return tf.sqrt(tf.reduce_sum(tf.square(a), axis=-1, keepdims=True))


# --- origin, phase, layer, cause -------------------------------------------------------------


def test_log_of_zero_in_a_custom_layer_is_found_in_forward() -> None:
    x, y = _data()
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(8, activation="relu", name="fc"), LogLayer(name="log"),
         keras.layers.Dense(1, name="head")],
        name="m",
    )
    model.compile(keras.optimizers.SGD(0.01), "mse")
    with pytest.raises(NonFiniteError) as info:
        model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[nk.NanGuard()])
    f, d = info.value.finding, info.value.diagnosis
    assert (f.op, f.phase, f.module, f.module_type) == ("Log", "forward", "m/log", "LogLayer")
    assert (f.framework, f.detected_by, f.reached, f.step) == ("keras", "replay", "loss", 0)
    assert f.source is not None and f.source.startswith("tests/test_keras.py:")
    assert f.source_code == "return tf.math.log(x)  # log(0) = -inf where a ReLU gave 0"
    assert f.inputs[0].name == "x" and f.inputs[0].zeros > 0 and f.neginf > 0
    assert f.details["input_producers"] == ["Relu"]
    assert d is not None and d.cause is Cause.UNSAFE_OP
    assert any("keras.ops.log(keras.ops.maximum(x, 1e-12))" in fix for fix in d.fixes)
    # the update of the failing step never reached the weights
    assert _all_finite(model, model.optimizer)


def test_nan_sample_is_reported_as_data_with_its_row_and_feature() -> None:
    x, y = _data()
    x[37, 5] = np.nan
    model = _mlp(name="m")
    model.compile(keras.optimizers.SGD(0.01), "mse")
    with pytest.raises(NonFiniteError) as info:
        model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0, callbacks=[nk.NanGuard()])
    f, d = info.value.finding, info.value.diagnosis
    assert (f.phase, f.op, f.module, f.step) == ("data", "input", "m/fc1", 1)
    assert f.details["input_name"] == "x" and f.nan == 1
    assert f.details["samples"] == [{"index": 5, "kind": "NaN", "features": [5]}]
    # TF's ReluGrad maps the NaN to 0; the old check would have fired at fc1's ReLU
    assert "`m/fc1` (Dense)" in f.details["relu_grad"]
    assert d is not None and d.cause is Cause.NONFINITE_INPUT
    assert "sample 5 of x, feature 5 is NaN" in d.evidence[0]


def test_seed_scenario_learning_rate_too_high() -> None:
    from nanguard.demos import seed_keras

    with pytest.raises(NonFiniteError) as info:
        seed_keras.train(seed_keras.LR, steps=60)
    f, d = info.value.finding, info.value.diagnosis
    assert (f.op, f.phase, f.module, f.module_type, f.reached) == ("MatMul", "forward", "seed/fc2", "Dense", "loss")
    assert f.step is not None and 4 <= f.step <= 12
    assert f.details["relu_grad_layer"] == "`seed/relu2` (ReLU)"
    assert d is not None and d.cause is Cause.LEARNING_RATE_TOO_HIGH
    assert d.fixes[0].startswith("optimizer = keras.optimizers.SGD(learning_rate=0.")


def _unscaled_fit(standardised: bool, lr: float = 0.1, epochs: int = 2, cb: Any = None) -> list[float]:
    rng = np.random.default_rng(0)
    x = (rng.random((2048, 6)) * np.array([1.0, 10.0, 100.0, 1000.0, 5.0, 50.0])).astype("float32")
    y = (x @ np.array([[0.3], [0.02], [0.004], [0.0005], [0.2], [0.01]]) * 100 + 200).astype("float32")
    if standardised:  # the first two fixes nanguard suggests for it
        norm = keras.layers.Normalization()
        norm.adapt(x)
        x = norm(x)
        y = (y - y.mean()) / y.std()
    model = _mlp(6)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=lr, momentum=0.9), loss="mse")
    h = model.fit(x, y, batch_size=64, epochs=epochs, verbose=0, callbacks=[cb] if cb is not None else [])
    return [float(v) for v in h.history["loss"]]


def test_unscaled_data_in_fit_is_the_root_and_the_advice_was_tried() -> None:
    """``fit`` on raw features and targets in the hundreds, SGD(0.1, momentum 0.9), policy
    ``raise``: ``unscaled-data``, first fix a ``Normalization`` layer — applied by hand (with the
    targets scaled) ``fit`` trains at the script's own learning rate; the learning rate after it
    is one that trained on the failing step from the snapshot before the first update."""
    with pytest.raises(NonFiniteError) as info:
        _unscaled_fit(False, cb=nk.NanGuard())
    d = info.value.diagnosis
    assert d is not None and d.cause is Cause.UNSCALED_DATA
    assert any(e.startswith("the mse was already ") and "targets up to 431" in e for e in d.evidence), d.evidence
    assert d.fixes[0].startswith("norm = keras.layers.Normalization()")
    assert d.trials and d.trials[0]["from_step"] == 0 and d.trials[-1]["verified"]
    assert not any(t["verified"] for t in d.trials[:-1])
    lr = d.trials[-1]["lr"]
    assert d.fixes[2].startswith(f"optimizer = keras.optimizers.SGD(learning_rate={lr:.2g}, momentum=0.9)  # was 0.1; "
                                 "verified on the failing step: loss "), d.fixes
    losses = _unscaled_fit(True, epochs=3)
    assert all(math.isfinite(v) for v in losses) and losses[-1] < 0.05


def test_adam_epsilon_zero_is_an_optimizer_finding() -> None:
    rng = np.random.default_rng(0)
    onehot = np.eye(6, dtype="float32")[rng.integers(0, 5, size=128)]  # category 5 never occurs
    y = rng.standard_normal((128, 1)).astype("float32")
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, name="embed"),
                              keras.layers.Dense(1, name="head")], name="m")
    model.compile(keras.optimizers.Adam(1e-3, epsilon=0.0), "mse")
    with pytest.raises(NonFiniteError) as info:
        model.fit(onehot, y, batch_size=32, epochs=1, verbose=0, callbacks=[nk.NanGuard()])
    f, d = info.value.finding, info.value.diagnosis
    assert (f.op, f.phase, f.module, f.reached, f.step) == ("Adam.apply", "optimizer", "m/embed", "parameters", 0)
    assert f.details["parameters"] == ["m/embed/kernel"] and f.details["grads_finite"] is True
    assert d is not None and d.cause is Cause.OPTIMIZER_STATE
    assert "epsilon=1e-7" in d.fixes[0]


def test_adam_epsilon_zero_under_recover_rolls_back_and_raises_epsilon() -> None:
    rng = np.random.default_rng(0)
    onehot = np.eye(6, dtype="float32")[rng.integers(0, 5, size=128)]
    y = rng.standard_normal((128, 1)).astype("float32")
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, name="embed"),
                              keras.layers.Dense(1, name="head")], name="m")
    opt = keras.optimizers.Adam(1e-2, epsilon=0.0)
    model.compile(opt, "mse")
    cb = nk.NanGuard(policy="recover")
    hist = model.fit(onehot, y, batch_size=32, epochs=3, verbose=0, callbacks=[cb])
    assert [r["action"] for r in cb.recoveries] == ["rollback"]
    assert cb.recoveries[0]["eps"] == 1e-8 and cb.recoveries[0]["restored_step"] == 0
    assert _all_finite(model, opt) and all(math.isfinite(v) for v in hist.history["loss"])
    assert opt.epsilon == 0.0  # the user's object is unchanged; the guard's epsilon is used


def test_float16_overflow_is_low_precision() -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(0, 60000, size=(128, 32)).astype("float32")  # raw, unnormalised counts
    y = x.mean(axis=1, keepdims=True) / 30000.0
    model = keras.Sequential(
        [keras.Input((32,)), keras.layers.Dense(64, activation="relu", dtype="float16", name="half"),
         keras.layers.Dense(1, name="head")],
        name="m",
    )
    model.compile(keras.optimizers.SGD(1e-4), "mse")
    with pytest.raises(NonFiniteError) as info:
        model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[nk.NanGuard()])
    f, d = info.value.finding, info.value.diagnosis
    assert (f.op, f.phase, f.module, f.dtype, f.step) == ("MatMul", "forward", "m/half", "float16", 0)
    assert f.details["float32_finite"] is True and f.details["float32_absmax"] > 65504
    assert d is not None and d.cause is Cause.LOW_PRECISION_OVERFLOW
    assert any("mixed_bfloat16" in fix for fix in d.fixes)
    assert d.summary == "float16 overflow in `MatMul`"  # TensorFlow's name for it, not torch's `mm`


def test_mixed_precision_loss_scale_skips_are_not_failures_but_a_nan_batch_is() -> None:
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        x, y = _data()
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu", name="fc1"),
                                  keras.layers.Dense(1, dtype="float32", name="head")], name="m")
        model.compile(keras.optimizers.Adam(1e-2), "mse")  # keras wraps it in a LossScaleOptimizer
        cb = nk.NanGuard()
        model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[cb])
        assert type(model.optimizer).__name__ == "LossScaleOptimizer" and cb.findings == []
        x[40, 1] = np.nan
        with pytest.raises(NonFiniteError) as info:
            model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    f = info.value.finding
    assert (f.phase, f.op, f.module, f.step) == ("data", "input", "m/fc1", 9)
    assert f.details["note"] == "the loss itself is not finite: no loss scale can fix it"


def test_float16_cast_of_raw_counts_is_low_precision_not_initialization() -> None:
    # mixed_float16 casts the float32 input to float16 inside the first layer: 65535 overflows
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        x = np.full((64, 16, 1), 30000.0, dtype="float32")
        x[5, 3, 0] = 65535.0  # a raw uint16 reading
        y = np.zeros((64, 1), dtype="float32")
        inp = keras.Input((16, 1))
        h = keras.layers.Conv1D(4, 3, activation="relu", name="conv")(inp)
        out = keras.layers.Dense(1, dtype="float32", name="head")(keras.layers.Flatten()(h))
        model = keras.Model(inp, out, name="sensor")
        model.compile(keras.optimizers.Adam(1e-3), "mse")
        with pytest.raises(NonFiniteError) as info:
            model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0, callbacks=[nk.NanGuard()])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    f, d = info.value.finding, info.value.diagnosis
    assert (f.op, f.phase, f.module, f.dtype, f.step) == ("Cast", "forward", "sensor/conv", "float16", 0)
    assert f.details["float32_finite"] is True
    assert d is not None and d.cause is Cause.LOW_PRECISION_OVERFLOW
    assert any("6.554e+04" in e and "6.55e+04" in e for e in d.evidence)  # 65535 vs 65504, told apart


def test_a_loss_scale_that_needs_more_than_ten_halvings_is_still_the_optimizers_business() -> None:
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        rng = np.random.default_rng(0)
        x = (rng.standard_normal((512, 8)) * 20).astype("float32")
        y = (np.abs(x).sum(1, keepdims=True) * 3).astype("float32")
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu", name="fc1"),
                                  keras.layers.Dense(1, dtype="float32", name="head")], name="m")
        model.compile(keras.optimizers.SGD(1e-7), "mse")
        cb = nk.NanGuard()
        hist = model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[cb])
        scale = float(model.optimizer.dynamic_scale.numpy())
    finally:
        keras.mixed_precision.set_global_policy("float32")
    skips = sum(1 for r in cb.history if r.event == "scaler-skip")
    assert cb.findings == [] and skips > 10  # 12 halvings from 2**15 to 8; 10 is the skip limit
    assert 1.0 < scale < 2.0**15 and all(math.isfinite(v) for v in hist.history["loss"])


def test_sqrt_at_zero_is_found_in_backward_in_a_custom_loop() -> None:
    x, y = _data(n=64)
    x[8:16] = 0.0  # sqrt(sum(0)) = 0: finite forward, infinite derivative
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, use_bias=False, name="proj"),
                              Distance(name="norm"), keras.layers.Dense(1, name="head")], name="m")
    opt = keras.optimizers.SGD(0.01)
    guard = nk.attach(model, opt)

    @guard.wrap
    @tf.function
    def train_step(xb: Any, yb: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    with pytest.raises(NonFiniteError) as info:
        for i in range(0, 64, 8):
            train_step(tf.constant(x[i:i + 8]), tf.constant(y[i:i + 8]))
    guard.detach()
    f, d = info.value.finding, info.value.diagnosis
    assert (f.op, f.phase, f.grad_fn, f.module, f.step) == ("SqrtGrad", "backward", "_SqrtGrad", "m/norm", 1)
    assert f.reached == "gradients" and f.source_code is not None and "tf.sqrt" in f.source_code
    assert d is not None and d.cause is Cause.UNSAFE_OP
    assert "backward of `sqrt`" in d.summary


def test_already_nonfinite_weights_are_parameters() -> None:
    x, y = _data()
    model = _mlp(name="m")
    model.compile(keras.optimizers.SGD(0.01), "mse")
    w = model.get_layer("head").kernel
    w.assign(np.where(np.arange(16)[:, None] == 3, np.inf, w.numpy()).astype("float32"))
    with pytest.raises(NonFiniteError) as info:
        model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[nk.NanGuard()])
    f, d = info.value.finding, info.value.diagnosis
    assert (f.op, f.module, f.details["parameters"]) == ("parameter", "m/head", ["m/head/kernel"])
    assert d is not None and d.cause is Cause.NONFINITE_PARAMETERS
    assert any("load_weights" in fix for fix in d.fixes)


def test_locate_context_manager_raises_at_the_origin() -> None:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, activation="relu", name="fc"),
                              LogLayer(name="log")], name="m")
    x = tf.constant(np.random.default_rng(0).standard_normal((8, 4)).astype("float32"))
    with pytest.raises(NonFiniteError) as info, nk.locate():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x))
        tape.gradient(loss, model.trainable_variables)
    f = info.value.finding
    assert (f.op, f.module, f.reached, f.detected_by) == ("Log", "m/log", "loss", "trace")


def test_locate_names_the_op_inside_an_optimizer_update() -> None:
    onehot = np.eye(6, dtype="float32")[np.random.default_rng(0).integers(0, 5, size=32)]
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, name="embed"),
                              keras.layers.Dense(1, name="head")], name="m")
    opt = keras.optimizers.Adam(1e-3, epsilon=0.0)
    with pytest.raises(NonFiniteError) as info, nk.locate():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(onehot)))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
    f = info.value.finding
    assert (f.op, f.phase, f.module, f.reached) == ("RealDiv", "optimizer", "m/embed", "parameters")
    assert f.details["parameters"] == ["m/embed/kernel"] and f.inputs[1].zeros > 0


# --- healthy controls: nothing is reported, nothing changes -------------------------------------


class CausalAttention(keras.layers.Layer):
    def __init__(self, dim: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.qkv = keras.layers.Dense(3 * dim, name="qkv")
        self.dim = dim

    def call(self, x: Any) -> Any:
        q, k, v = tf.split(self.qkv(x), 3, axis=-1)
        t = tf.shape(x)[1]
        causal = tf.linalg.band_part(tf.ones((t, t), dtype=tf.bool), -1, 0)
        scores = tf.where(causal, tf.matmul(q, k, transpose_b=True), float("-inf"))
        return tf.matmul(tf.nn.softmax(scores / self.dim**0.5, axis=-1), v)


def test_masks_that_softmax_absorbs_and_batchnorm_are_not_findings() -> None:
    rng = np.random.default_rng(0)
    # a -inf causal mask in a custom layer (absorbed by the softmax), under replay and locate()
    x = rng.standard_normal((64, 6, 4)).astype("float32")
    y = np.cumsum(x[..., :1], axis=1).astype("float32")
    att = keras.Sequential([keras.Input((6, 4)), CausalAttention(8, name="attn"),
                            keras.layers.Dense(1, name="out")], name="causal")
    att.compile(keras.optimizers.Adam(1e-2), "mse")
    cb = nk.NanGuard()
    att.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[cb])
    assert cb.findings == [] and len(cb.guard.history) == 8
    with nk.locate() as loc:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(att(x[:16]) - y[:16]))
        tape.gradient(loss, att.trainable_variables)
    assert loc.findings == []
    # Keras' own padding masks (MultiHeadAttention, Embedding(mask_zero=True) + LSTM) and BatchNorm
    tokens = rng.integers(1, 20, size=(64, 6))
    tokens[:, 3:] *= (rng.random((64, 3)) < 0.3)
    inp = keras.Input((6,), dtype="int32")
    emb = keras.layers.Embedding(20, 8, mask_zero=True)(inp)
    pad = keras.ops.not_equal(inp, 0)
    h = keras.layers.MultiHeadAttention(2, 4)(emb, emb, attention_mask=pad[:, None, :] & pad[:, :, None])
    h = keras.layers.BatchNormalization()(keras.layers.LSTM(8)(h))
    model = keras.Model(inp, keras.layers.Dense(1)(h))
    model.compile(keras.optimizers.Adam(1e-2), "mse")
    cb = nk.NanGuard(policy="recover")
    model.fit(tokens, rng.standard_normal((64, 1)), batch_size=16, epochs=2, verbose=0, callbacks=[cb])
    assert cb.findings == [] and cb.recoveries == []


def _fit_once(policy: str | None) -> list[np.ndarray]:
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    x, y = _data()
    model = _mlp(dropout=True, bn=True)
    opt = keras.optimizers.Adam(1e-2)
    model.compile(opt, "mse")
    cbs = [nk.NanGuard(policy=policy)] if policy else []
    model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=cbs)
    return _values(model, opt)


def test_a_healthy_fit_is_bit_for_bit_unchanged_under_every_policy() -> None:
    plain = _fit_once(None)
    for policy in ("raise", "skip", "recover"):
        guarded = _fit_once(policy)
        assert len(guarded) == len(plain)
        assert all(np.array_equal(a, b) for a, b in zip(plain, guarded)), policy


@pytest.mark.parametrize("seed", [0, 4])
def test_a_custom_loops_replay_draws_what_the_step_drew(seed: int) -> None:
    """A mask drawn with NumPy inside the step (a hand-made dropout): the replay puts the host
    random state of the step's start back, so it draws the same mask and finds the ``log`` of 0
    the step computed (with a fresh mask it did not reproduce on these seeds); the run's own
    random state goes on from where it was."""
    np.random.seed(seed)
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    opt = keras.optimizers.SGD(1e-3)
    guard = nk.attach(model, opt)

    @guard.wrap
    def step(x: Any) -> Any:
        with tf.GradientTape() as tape:
            mask = (np.random.rand(1, 2) > 0.5).astype("float32")
            z = tf.math.log(tf.reduce_sum(x * mask, axis=-1, keepdims=True))
            loss = tf.reduce_mean((model(z) - 1.0) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    with pytest.raises(NonFiniteError) as info:
        for _ in range(50):
            step(tf.ones((1, 2)))
    f = info.value.finding
    assert (f.op, f.detected_by, f.phase) == ("Log", "replay", "forward")
    assert "note" not in f.details


def test_a_healthy_custom_loop_is_bit_for_bit_unchanged() -> None:
    def run(guarded: bool) -> list[np.ndarray]:
        keras.backend.clear_session()
        keras.utils.set_random_seed(0)
        x, y = _data()
        model = _mlp(dropout=True)
        opt = keras.optimizers.RMSprop(learning_rate=keras.optimizers.schedules.ExponentialDecay(1e-2, 10, 0.9))
        guard = nk.attach(model, opt, policy="recover") if guarded else None

        @tf.function
        def step(xb: Any, yb: Any) -> Any:
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss

        fn = guard.wrap(step) if guard is not None else step
        for i in range(0, 256, 32):
            fn(x[i:i + 32], y[i:i + 32])
        if guard is not None:
            assert guard.findings == [] and guard.step == 8 and len(guard.history) == 8
            guard.detach()
        return _values(model, opt)

    assert all(np.array_equal(a, b) for a, b in zip(run(False), run(True)))


# --- policies -----------------------------------------------------------------------------------


def test_skip_never_applies_a_bad_update_and_puts_the_metrics_right() -> None:
    x, y = _data()
    x[[5, 70, 200], 2] = np.nan  # three poisoned batches
    model = _mlp(bn=True)
    opt = keras.optimizers.Adam(1e-2)
    model.compile(opt, "mse")
    cb = nk.NanGuard(policy="skip")
    hist = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0, callbacks=[cb])
    assert cb.guard.total_notfinite == 6 and cb.guard.notfinite_count == 0
    assert [r["step"] for r in cb.recoveries] == [0, 2, 6, 8, 10, 14]
    assert {r["action"] for r in cb.recoveries} == {"skip"}
    assert _all_finite(model, opt)  # weights, BatchNorm statistics and Adam's moments
    assert all(math.isfinite(v) for v in hist.history["loss"])  # the loss metric was put back
    assert int(opt.iterations.numpy()) == 16 - 6  # skipped steps are not optimizer steps


def test_skip_gives_up_after_n_consecutive_skips() -> None:
    x, y = _data()
    x[:, 0] = np.nan
    model = _mlp()
    model.compile(keras.optimizers.SGD(0.01), "mse")
    with pytest.raises(GiveUpError) as info:
        model.fit(x, y, batch_size=32, epochs=1, verbose=0,
                  callbacks=[nk.NanGuard(policy="skip", max_consecutive_skips=3)])
    assert "3 consecutive steps" in info.value.reason
    assert model.train_function is None  # fit's own function again for the next fit


def test_recover_drops_a_poisoned_batch_and_logs_its_samples(capfd: pytest.CaptureFixture[str]) -> None:
    """The batch is dropped and its samples logged; the callback says so as it happens (one line
    on stderr) and, at the end of ``fit``, prints the summary and the verdict ``nanguard run``
    prints (a dropped batch after a single healthy step: too few to know the run's level — said
    so, never "recovered")."""
    x, y = _data()
    x[40, 1] = np.inf
    model = _mlp()
    model.compile(keras.optimizers.SGD(0.01), "mse")
    cb = nk.NanGuard(policy="recover")
    model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
    assert cb.recoveries == [
        {**cb.recoveries[0], "step": 1, "action": "drop_batch", "samples": [8], "input": "x"}
    ]
    assert cb.findings[0][0].details["samples"] == [{"index": 8, "kind": "+Inf", "features": [1]}]
    err = capfd.readouterr().err
    assert "nanguard: step 1: nonfinite-input → drop batch" in err
    assert "nanguard: the run finished after" in err and "step 1: nonfinite-input → drop batch\n" in err
    assert cb.guard.outcome is not None and f"outcome: not judged — {cb.guard.outcome['reason']}" in err


def test_recover_tries_its_fix_on_the_failing_step_before_applying_it() -> None:
    """The Keras path goes through the same step driver as torch: a learning-rate back-off is
    tried from the snapshot on the failing step's batch and applied only once verified (the
    recovery says so, with the losses), never applied untried."""
    from nanguard.demos import seed_keras

    cb, losses = seed_keras.train(seed_keras.LR, steps=40, policy="recover")
    (r,) = cb.recoveries
    assert r["action"] == "rollback" and r["verified"] is True
    (t,) = [t for t in r["trials"] if t["verified"]]
    assert t["from_step"] == r["restored_step"] == 0 and t["losses"][-1] < t["losses"][0]
    assert r["lr_scale"] == pytest.approx(t["lr_factor"])
    _, diag = cb.findings[0]
    assert diag.fixes[0].startswith("lr = ") and "verified on the failing step" in diag.fixes[0]
    assert all(math.isfinite(v) for v in losses[r["step"] + 1:])


def test_recover_rolls_back_backs_off_a_schedule_and_finishes() -> None:
    from nanguard.demos import seed_keras

    cb, losses = seed_keras.train(seed_keras.LR, steps=120, policy="recover")
    (r,) = cb.recoveries
    assert (r["action"], r["cause"], r["restored_step"]) == ("rollback", "learning-rate-too-high", 0)
    assert r["lr_scale"] < 0.05
    # the back-off is a factor applied at every step — grown back after 50 healthy steps: the
    # recorded learning rate carries the factor in force
    changes = cb.guard.recovery_state.lr_changes
    assert changes and changes[0]["step"] == r["step"] + 50 and changes[0]["lr_scale"] == 2 * r["lr_scale"]

    def scale_at(step: int) -> float:
        return next((c["lr_scale"] for c in reversed(changes) if c["step"] < step), r["lr_scale"])

    after = [h for h in cb.guard.history if h.step > r["step"]]
    assert all(h.lr == pytest.approx(seed_keras.LR * scale_at(h.step), rel=1e-6) for h in after)
    assert all(math.isfinite(v) for v in losses[r["step"] + 1:])
    assert losses[-1] < losses[0]


def test_backoff_multiplies_a_learning_rate_schedule_instead_of_replacing_it() -> None:
    x, y = _data()
    model = _mlp()
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
    opt = keras.optimizers.SGD(schedule)
    model.compile(opt, "mse")
    cb = nk.NanGuard(policy="recover")
    model.fit(x[:64], y[:64], batch_size=32, epochs=1, verbose=0, callbacks=[cb])
    state = next(iter(cb.guard._states.values()))
    state.lr_scale.assign(0.25)  # as a rollback leaves it
    model.fit(x[:64], y[:64], batch_size=32, epochs=1, verbose=0, callbacks=[cb])
    lrs = [h.lr for h in cb.guard.history]
    assert lrs[:2] == pytest.approx([0.1, 0.05])
    assert lrs[2:] == pytest.approx([0.25 * 0.025, 0.25 * 0.0125])  # schedule(iterations) x 0.25


def test_clipping_switched_on_clips_by_the_global_norm() -> None:
    x, y = _data(n=32)
    model = _mlp()
    opt = keras.optimizers.SGD(0.1)
    guard = nk.attach(model, opt, policy="recover")
    state = next(iter(guard._states.values()))
    state.clip.assign(0.5)

    def grads_and_step() -> tuple[list[np.ndarray], list[np.ndarray]]:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        g = tape.gradient(loss, model.trainable_variables)
        before = [v.numpy() for v in model.trainable_variables]
        opt.apply_gradients(zip(g, model.trainable_variables))  # eager: checked right after
        return [t.numpy() for t in g], before

    g, before = grads_and_step()
    norm = math.sqrt(sum(float((t.astype(np.float64) ** 2).sum()) for t in g))
    assert norm > 0.5
    for v, w0, gi in zip(model.trainable_variables, before, g):
        np.testing.assert_allclose(v.numpy(), w0 - 0.1 * gi * (0.5 / norm), rtol=1e-5, atol=1e-7)
    assert guard.step == 1 and guard.history[0].grad_norm == pytest.approx(norm, rel=1e-5)
    guard.detach()


def test_snapshot_restores_weights_and_optimizer_variables_bit_for_bit() -> None:
    x, y = _data()
    model = _mlp(bn=True)
    opt = keras.optimizers.Adam(1e-2)
    model.compile(opt, "mse")
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    variables = list(model.variables) + list(opt.variables)
    snap = Snapshotter().take(3, variables)
    saved = _values(model, opt)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    for v in model.trainable_variables:
        v.assign(tf.fill(v.shape, float("nan")))
    Snapshotter.restore(snap)
    assert all(np.array_equal(a, b) for a, b in zip(saved, _values(model, opt)))


def test_misuse_gets_clear_errors() -> None:
    model = _mlp()
    opt = keras.optimizers.SGD(0.1)
    with pytest.raises(ValueError, match="valid policies are raise, skip, recover"):
        nk.NanGuard(policy="ignore")
    with pytest.raises(TypeError, match=r"expects a keras\.optimizers\.Optimizer"):
        nk.attach(model, "sgd")
    with nk.attach(model, opt), pytest.raises(RuntimeError, match="already guarding this optimizer"):
        nk.attach(model, opt)


# --- nanguard run, the demo, imports --------------------------------------------------------------

FIT_SCRIPT = """
    import numpy as np, keras, tensorflow as tf
    keras.utils.set_random_seed(0)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2048, 16)).astype("float32")
    y = np.maximum(x @ rng.standard_normal((16, 1)).astype("float32"), 0) + x[:, :1]
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(64, name="fc1"),
                              keras.layers.ReLU(name="relu1"), keras.layers.Dense(64, name="fc2"),
                              keras.layers.ReLU(name="relu2"), keras.layers.Dense(1, name="head")],
                             name="seed")
    model.compile(keras.optimizers.SGD(0.5), "mse")
    model.fit(x, y, batch_size=64, epochs=2, verbose=0)
    print("finished")
"""

LOOP_SCRIPT = """
    import numpy as np, tensorflow as tf
    keras = tf.keras                      # only tensorflow is imported by name
    x = np.random.default_rng(0).standard_normal((128, 8)).astype("float32")
    x[77, 2] = np.nan
    y = x.sum(axis=1, keepdims=True)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1)])
    opt = keras.optimizers.Adam(1e-2)

    @tf.function
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(xb, training=True) - yb) ** 2)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    for i in range(0, 128, 16):
        print(i, float(train_step(x[i:i + 16], y[i:i + 16])))
"""


def _run(spawn: Spawn, tmp_path: Path, body: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "train.py").write_text(textwrap.dedent(body))
    return spawn.nanguard("run", *args, "--json", "log.json", "train.py",
                          cwd=tmp_path, timeout=600, env=ENV)


def test_nanguard_run_on_a_keras_fit_script_exits_3_with_a_json_log(tmp_path: Path,
                                                                    spawn: Spawn) -> None:
    proc = _run(spawn, tmp_path, FIT_SCRIPT)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "finished" not in proc.stdout
    assert "nanguard: the first non-finite value was made in the forward pass" in proc.stderr
    log = json.loads((tmp_path / "log.json").read_text())
    assert (log["status"], log["framework"], log["exit_code"]) == ("nonfinite", "keras", 3)
    (ev,) = log["events"]
    assert (ev["phase"], ev["cause"], ev["framework"]) == ("forward", "learning-rate-too-high", "keras")
    # depending on the CPU's kernels, a hidden layer or the squared error overflows first
    assert (ev["op"], ev["module"]) in {("MatMul", "seed/fc2"), ("MatMul", "seed/head"), ("Square", "mse")}
    assert ev["source"] == "train.py:13" and ev["detected_by"] == "replay"
    # the failing step is a step too: it ended when it raised
    assert len(log["history"]) == log["steps"] and log["history"][0]["grad_norm"] > 0
    assert log["history"][-1]["finite"] is False and log["history"][-1]["event"] == "nonfinite"


def test_nanguard_run_guards_a_tensorflow_custom_loop(tmp_path: Path, spawn: Spawn) -> None:
    proc = _run(spawn, tmp_path, LOOP_SCRIPT, "--policy", "skip")
    assert proc.returncode == 0, proc.stderr[-2000:]
    after = proc.stdout.split("\n64 ")[-1].splitlines()[1:]  # the steps after the bad batch
    assert len(after) == 3 and all(math.isfinite(float(line.split()[1])) for line in after)
    log = json.loads((tmp_path / "log.json").read_text())
    # 3 healthy steps after the bad batch: too few to tell whether the run came back — said so
    assert (log["status"], log["framework"], log["steps"]) == ("unjudged", "keras", 8)
    assert log["outcome"]["reason"].startswith("the run ended 3 healthy steps after the last event")
    (ev,) = log["events"]
    assert (ev["phase"], ev["op"], ev["cause"]) == ("data", "input", "nonfinite-input")
    assert ev["details"]["input_name"] == "xb" and ev["details"]["samples"][0]["index"] == 13
    assert log["recoveries"][0]["action"] == "skip"


def test_demo_framework_keras(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from nanguard.cli.demo_keras import main

    assert main(argparse.Namespace(lr=None, steps=120, framework="keras")) == 0
    out = capsys.readouterr().out
    assert "op        MatMul" in out and "module    seed/fc2 (Dense)" in out
    assert "TensorFlow 1.x stopped at:  `seed/relu2` (ReLU)" in out
    assert "cause: learning-rate-too-high" in out
    assert "(finite and decreasing)." in out


def test_keras_adapter_needs_no_torch_and_core_needs_no_tensorflow(spawn: Spawn) -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None          # as if torch were not installed
        import nanguard, nanguard.keras
        assert nanguard.keras.NanGuard and "torch" not in [m.split(".")[0] for m in sys.modules if sys.modules[m]]
        print("keras ok")
        """
    )
    proc = spawn.python("-c", code, timeout=600, env=ENV)
    assert proc.returncode == 0 and "keras ok" in proc.stdout, proc.stderr[-2000:]
    code = textwrap.dedent(
        """
        import sys
        sys.modules["tensorflow"] = None     # as if TensorFlow were not installed
        sys.modules["keras"] = None
        import nanguard, nanguard.core
        try:
            import nanguard.keras
        except ImportError as exc:
            print("no tf:", isinstance(exc, ImportError))
        """
    )
    proc = spawn.python("-c", code, timeout=600, env=ENV)
    assert proc.returncode == 0 and "no tf: True" in proc.stdout, proc.stderr[-2000:]
