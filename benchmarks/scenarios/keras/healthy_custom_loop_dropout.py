# expect: {"healthy": true}
# about: a custom training loop (tf.function + tf.GradientTape + optimizer.apply_gradients) on an MLP with Dropout and an AdamW optimizer with a cosine-decay learning-rate schedule.
import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(0)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

rng = np.random.default_rng(0)
x = rng.standard_normal((512, 10)).astype("float32")
y = (x @ rng.standard_normal((10, 1))).astype("float32")

model = keras.Sequential(
    [
        keras.Input((10,)),
        keras.layers.Dense(32, activation="relu", name="h1"),
        keras.layers.Dropout(0.3, name="drop"),
        keras.layers.Dense(1, name="out"),
    ],
    name="loop_mlp",
)
schedule = keras.optimizers.schedules.CosineDecay(3e-3, decay_steps=200)
optimizer = keras.optimizers.AdamW(learning_rate=schedule, weight_decay=1e-4)
loss_fn = keras.losses.MeanSquaredError()


@tf.function
def train_step(xb, yb):
    with tf.GradientTape() as tape:
        loss = loss_fn(yb, model(xb, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(512, seed=0).batch(32)
for epoch in range(4):
    for xb, yb in ds:
        loss = train_step(xb, yb)
    print(f"epoch {epoch} loss {float(loss):.4f}")
print(f"final loss {float(loss):.6g}")
