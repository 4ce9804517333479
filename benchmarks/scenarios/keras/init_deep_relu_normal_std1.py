# expect: {"cause": "bad-initialization", "phase": "forward", "op": ["MatMul", "Square"], "module": ["deep/dense_19", "mean_squared_error"]}
# about: a 20-layer ReLU MLP whose Dense layers are initialised with RandomNormal(stddev=1) instead of He; each layer multiplies the activation scale by ~sqrt(fan_in/2) and the first forward pass already overflows.
import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(0)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

rng = np.random.default_rng(0)
x = rng.standard_normal((512, 64)).astype("float32")
y = rng.standard_normal((512, 1)).astype("float32")

init = keras.initializers.RandomNormal(stddev=1.0)
layers = [keras.Input((64,))]
for i in range(19):
    layers.append(keras.layers.Dense(256, activation="relu", kernel_initializer=init, name=f"dense_{i}"))
layers.append(keras.layers.Dense(1, kernel_initializer=init, name="dense_19"))
model = keras.Sequential(layers, name="deep")
model.compile(optimizer=keras.optimizers.SGD(1e-3), loss=keras.losses.MeanSquaredError())
history = model.fit(x, y, batch_size=64, epochs=1, verbose=2)
print(f"final loss {history.history['loss'][-1]:.6g}")
