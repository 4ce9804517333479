# expect: {"cause": "nonfinite-input", "phase": "data", "op": "input", "module": "meter/dense_in"}
# about: held out (Keras, round 2): written after the code by someone who had not read it or the suite. a tf.data pipeline (from_tensor_slices -> shuffle(seed) -> map -> batch -> prefetch) scales each meter reading vector by its own max |value|; one meter reported all zeros, so map computes 0/0 = NaN for that sample; the model is Dense layers fed the dataset by model.fit.
import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(0)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

rng = np.random.default_rng(5)
readings = rng.gamma(2.0, 50.0, size=(400, 24)).astype("float32")
readings[233] = 0.0  # a meter that was offline all day
target = readings[:, 18:22].mean(axis=1, keepdims=True) / 100.0


def normalise(r, t):
    return r / tf.reduce_max(tf.abs(r)), t


ds = (
    tf.data.Dataset.from_tensor_slices((readings, target))
    .shuffle(400, seed=7, reshuffle_each_iteration=False)
    .map(normalise, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    .batch(25)
    .prefetch(2)
)
inp = keras.Input((24,), name="readings")
h = keras.layers.Dense(32, activation="tanh", name="dense_in")(inp)
out = keras.layers.Dense(1, name="dense_out")(h)
model = keras.Model(inp, out, name="meter")
model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse", metrics=["mae"])
hist = model.fit(ds, epochs=3, verbose=2)
print(f"final loss {hist.history['loss'][-1]:.6g}")
