# expect: {"cause": "unsafe-op", "phase": "forward", "op": "Log", "module": null}
# about: held out (Keras, round 2): written after the code by someone who had not read it or the suite. a custom tf.GradientTape loop (optimizer.apply(grads, vars), Keras 3 API) computes NLL as -log(p_true) with p = softmax(logits) picked by a one-hot mask; inputs are on a ~100x scale so logit gaps exceed ~104 and softmax underflows to exactly 0 for some true classes; log(0) = -inf on the first step, in the loop body (outside any layer).
import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(0)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

rng = np.random.default_rng(6)
x = (rng.standard_normal((384, 64)) * 100.0).astype("float32")  # raw sensor units, never scaled
y = rng.integers(0, 10, size=384)
y_onehot = np.eye(10, dtype="float32")[y]

model = keras.Sequential(
    [keras.Input((64,)), keras.layers.Dense(32, activation="relu", name="h"), keras.layers.Dense(10, name="logits")],
    name="tagger",
)
optimizer = keras.optimizers.Adam(1e-3)


@tf.function
def train_step(xb, yb):
    with tf.GradientTape() as tape:
        probs = tf.nn.softmax(model(xb, training=True), axis=-1)
        p_true = tf.reduce_sum(probs * yb, axis=-1)
        loss = tf.reduce_mean(-tf.math.log(p_true))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply(grads, model.trainable_variables)
    return loss


for epoch in range(3):
    for i in range(0, 384, 48):
        loss = train_step(x[i : i + 48], y_onehot[i : i + 48])
    print(f"epoch {epoch} loss {float(loss):.4f}")
print(f"final loss {float(loss):.6g}")
