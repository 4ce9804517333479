# expect: {"cause": "exploding-gradients", "phase": "optimizer", "op": "Adam.apply", "module": "rnn/recurrent/simple_rnn_cell"}
# about: a custom tf.GradientTape loop trains a ReLU SimpleRNN with gain-1.3 identity recurrent weights with Adam on ever longer sequences (up to 280 steps); the gradients grow with every step, stay finite (~1e20), but Adam's second moment grad*grad overflows float32.
import os

import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(0)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)

model = keras.Sequential(
    [
        keras.Input((None, 4)),
        keras.layers.SimpleRNN(
            16,
            activation="tanh" if FIXED else "relu",  # bounded activations do not explode
            recurrent_initializer=keras.initializers.Identity(gain=1.3),
            name="recurrent",
        ),
        keras.layers.Dense(1, name="head"),
    ],
    name="rnn",
)
optimizer = keras.optimizers.Adam(learning_rate=1e-3)
loss_fn = keras.losses.MeanAbsoluteError()


@tf.function(reduce_retracing=True)
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


rng = np.random.default_rng(0)
for step in range(40):
    length = min(20 + 20 * step, 280)  # curriculum: longer sequences every step, up to 280
    x = np.abs(rng.standard_normal((16, length, 4))).astype("float32")
    y = rng.standard_normal((16, 1)).astype("float32")
    loss = train_step(x, y)
    print(f"step {step} length {length} loss {float(loss):.4g}")
print(f"final loss {float(loss):.6g}")
