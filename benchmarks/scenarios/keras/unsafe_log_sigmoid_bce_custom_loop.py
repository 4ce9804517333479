# expect: {"cause": "unsafe-op", "phase": "forward", "op": "Log", "module": null}
# about: a custom tf.function training loop writes binary cross-entropy by hand as -y*log(sigmoid(z)) - (1-y)*log(1-sigmoid(z)); confident logits make 1 - sigmoid(z) exactly 0 and the log gives -inf.
import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(0)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

rng = np.random.default_rng(0)
x = (rng.standard_normal((512, 16)) * 10).astype("float32")
y = (x[:, :1] > 0).astype("float32")
y[::7] = 1.0 - y[::7]  # label noise: some confident predictions are wrong

model = keras.Sequential(
    [keras.Input((16,)), keras.layers.Dense(32, activation="relu", name="h"), keras.layers.Dense(1, name="logit")],
    name="bce",
)
optimizer = keras.optimizers.Adam(5e-2)


@tf.function
def train_step(xb, yb):
    with tf.GradientTape() as tape:
        p = tf.sigmoid(model(xb, training=True))
        loss = -tf.reduce_mean(yb * tf.math.log(p) + (1 - yb) * tf.math.log(1 - p))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


for epoch in range(20):
    for i in range(0, 512, 64):
        loss = train_step(x[i : i + 64], y[i : i + 64])
    print(f"epoch {epoch} loss {float(loss):.4f}")
print(f"final loss {float(loss):.6g}")
