# expect: {"cause": "unscaled-data", "phase": "forward", "op": ["MatMul", "BiasAdd", "Square", "Sub"], "module": ["housing/hidden", "housing/price", "mean_squared_error", "mse"]}
# about: held out (Keras, round 2): written after the code by someone who had not read it or the suite. (Module label corrected by its author after the run: with loss="mse" Keras names the loss wrapper `mse`; "mean_squared_error" is its name only for the MeanSquaredError class.) a Dense regression predicts raw house prices (~1e5..6e5, never scaled) with SGD(learning_rate=2.0, momentum=0.9); each update overshoots, the weights grow by orders of magnitude per step (momentum compounds it) until the forward pass (the output Dense or the squared error) overflows a few steps in.
import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(0)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

rng = np.random.default_rng(2)
n = 512
x = rng.standard_normal((n, 6)).astype("float32")  # features already standardised
price = (3.0e5 + 8.0e4 * x[:, 0] - 3.0e4 * x[:, 3] + 1.0e4 * rng.standard_normal(n)).astype("float32")

model = keras.Sequential(
    [
        keras.Input((6,)),
        keras.layers.Dense(16, activation="relu", name="hidden"),
        keras.layers.Dense(1, name="price"),
    ],
    name="housing",
)
model.compile(optimizer=keras.optimizers.SGD(learning_rate=2.0, momentum=0.9), loss="mse")
hist = model.fit(x, price, batch_size=64, epochs=3, verbose=2)
print(f"final loss {hist.history['loss'][-1]:.6g}")
