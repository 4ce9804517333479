"""The seed scenario in Keras: a Dense/ReLU network trained with a learning rate far too high.

In 2015 this setup made TensorFlow stop with ``ReluGrad input is not finite``: early TensorFlow
checked the forward input of every ReLU when it built the ReLU's gradient, so the error fired in
the backward pass at a ReLU, far from the layer where the value was made, and said nothing about
why. TensorFlow 2 dropped that check (``ReluGrad`` now maps NaN to 0 silently). Here nanguard
watches the same kind of run and reports the op, the layer, the line, the step and the cause.
Copy this file and change ``LR`` to see the difference.

Run it with ``nanguard demo --framework keras`` (or ``python -m nanguard.demos.seed_keras``).
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

import nanguard.keras

LR = 0.5  # far too high for this network: the weights grow ~100x per step
STEPS = 200
SEED = 0


def make_data(n: int = 2048, d: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """A synthetic regression task: y = relu(x·w) + x₀."""
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((n, d)).astype("float32")
    w = rng.standard_normal((d, 1)).astype("float32")
    return x, np.maximum(x @ w, 0) + x[:, :1]


def make_model(d: int = 16) -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((d,)),
            keras.layers.Dense(64, name="fc1"),
            keras.layers.ReLU(name="relu1"),
            keras.layers.Dense(64, name="fc2"),
            keras.layers.ReLU(name="relu2"),
            keras.layers.Dense(1, name="head"),
        ],
        name="seed",
    )


def train(lr: float, steps: int = STEPS, policy: str = "raise") -> tuple[nanguard.keras.NanGuard, list[float]]:
    """An ordinary ``model.fit``; the ``NanGuard`` callback is the only extra line."""
    keras.utils.set_random_seed(SEED)
    x, y = make_data()
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=SEED).batch(64).repeat()
    model = make_model()
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=lr), loss="mse")
    guard = nanguard.keras.NanGuard(policy=policy)
    model.fit(data, epochs=1, steps_per_epoch=steps, callbacks=[guard], verbose=0, shuffle=False)
    losses = [r.loss if r.loss is not None else float("nan") for r in guard.guard.history]
    return guard, losses


if __name__ == "__main__":
    try:
        train(LR)
    except nanguard.NonFiniteError as err:
        print(err)
