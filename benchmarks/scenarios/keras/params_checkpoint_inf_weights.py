# expect: {"cause": "nonfinite-parameters", "phase": "forward", "op": "parameter", "module": "autoencoder/decoder"}
# about: training resumes from a .weights.h5 checkpoint in which one weight of the decoder is inf, written by an earlier run that had diverged; model.load_weights loads it without complaint.
import os
import tempfile

import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(0)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)


def make_model():
    return keras.Sequential(
        [
            keras.Input((20,)),
            keras.layers.Dense(8, activation="relu", name="encoder"),
            keras.layers.Dense(20, name="decoder"),
        ],
        name="autoencoder",
    )


rng = np.random.default_rng(0)
x = rng.standard_normal((256, 20)).astype("float32")
ckpt = os.path.join(tempfile.mkdtemp(), "last.weights.h5")

old = make_model()  # the earlier run, which diverged
weights = old.get_weights()
weights[2][3, 7] = np.inf  # decoder kernel
old.set_weights(weights)
old.save_weights(ckpt)

model = make_model()
model.load_weights(ckpt)
model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
history = model.fit(x, x, batch_size=32, epochs=2, verbose=2)
print(f"final loss {history.history['loss'][-1]:.6g}")
