# expect: {"cause": "unsafe-op", "phase": "forward", "op": "RealDiv", "module": "sensors/standardize"}
# about: a custom layer standardises each feature with the batch's own mean and std; one sensor is stuck at a constant value, its std is 0 and (x - mean) / std is 0/0 = NaN.
import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(0)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)


class Standardize(keras.layers.Layer):
    def call(self, x):
        mean = tf.reduce_mean(x, axis=0, keepdims=True)
        std = tf.math.reduce_std(x, axis=0, keepdims=True)
        return (x - mean) / std


rng = np.random.default_rng(0)
x = rng.standard_normal((512, 6)).astype("float32") * 3 + 10
x[:, 4] = 21.5  # a sensor stuck at one reading
y = (x[:, :1] - 10) * 0.5 + rng.standard_normal((512, 1)).astype("float32") * 0.1

model = keras.Sequential(
    [
        keras.Input((6,)),
        Standardize(name="standardize"),
        keras.layers.Dense(16, activation="tanh", name="hidden"),
        keras.layers.Dense(1, name="out"),
    ],
    name="sensors",
)
model.compile(optimizer=keras.optimizers.RMSprop(1e-3), loss="mae")
history = model.fit(x, y, batch_size=64, epochs=2, verbose=2)
print(f"final loss {history.history['loss'][-1]:.6g}")
