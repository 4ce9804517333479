# expect: {"cause": "low-precision-overflow", "phase": "forward", "op": "MatMul", "module": "counts/dense_in"}
# about: the whole model runs in float16 (keras.config.set_dtype_policy("float16")) and is fed raw, unnormalised sensor counts up to ~60000; the first Dense layer's output exceeds float16's maximum 65504.
import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(0)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
keras.config.set_dtype_policy("float16")

rng = np.random.default_rng(0)
x = rng.integers(0, 60000, size=(512, 32)).astype("float32")  # raw photon counts
y = (x.mean(axis=1, keepdims=True) / 30000.0).astype("float32")

model = keras.Sequential(
    [
        keras.Input((32,)),
        keras.layers.Dense(64, activation="relu", name="dense_in"),
        keras.layers.Dense(1, name="dense_out"),
    ],
    name="counts",
)
model.compile(optimizer=keras.optimizers.SGD(1e-4), loss="mse")
history = model.fit(x, y, batch_size=64, epochs=1, verbose=2)
print(f"final loss {history.history['loss'][-1]:.6g}")
