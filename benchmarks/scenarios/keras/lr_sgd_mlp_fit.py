# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": ["MatMul", "Square"], "module": ["regressor/hidden2", "regressor/out", "mean_squared_error"]}
# about: a three-layer ReLU regressor trained with SGD(learning_rate=0.5) via model.fit; every update overshoots and the weights grow step after step until an op overflows.
import os

import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(0)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)

rng = np.random.default_rng(0)
x = rng.standard_normal((2048, 16)).astype("float32")
w = rng.standard_normal((16, 1)).astype("float32")
y = np.maximum(x @ w, 0) + x[:, :1]

model = keras.Sequential(
    [
        keras.Input((16,)),
        keras.layers.Dense(64, activation="relu", name="hidden1"),
        keras.layers.Dense(64, activation="relu", name="hidden2"),
        keras.layers.Dense(1, name="out"),
    ],
    name="regressor",
)
model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.05 if FIXED else 0.5), loss=keras.losses.MeanSquaredError())
history = model.fit(x, y, batch_size=64, epochs=3, verbose=2)
print(f"final loss {history.history['loss'][-1]:.6g}")
