# expect: {"cause": "optimizer-state", "phase": "optimizer", "op": "Adam.apply", "module": "shop/embed_category"}
# about: Adam(epsilon=0) on a model with a one-hot category input in which one category never occurs; that input's weight gradient is exactly 0, and Adam's update there is 0 / sqrt(0) = NaN.
import os

import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(0)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)

rng = np.random.default_rng(0)
n, k = 512, 8
category = rng.integers(0, k - 1, size=n)  # category k-1 ("discontinued") never appears
onehot = np.eye(k, dtype="float32")[category]
y = (category % 2).astype("float32")[:, None]

model = keras.Sequential(
    [
        keras.Input((k,)),
        keras.layers.Dense(16, activation="relu", name="embed_category"),
        keras.layers.Dense(1, name="score"),
    ],
    name="shop",
)
model.compile(
    optimizer=keras.optimizers.Adam(learning_rate=1e-3, epsilon=1e-7 if FIXED else 0.0),
    loss=keras.losses.BinaryCrossentropy(from_logits=True),
)
history = model.fit(onehot, y, batch_size=64, epochs=2, verbose=2)
print(f"final loss {history.history['loss'][-1]:.6g}")
