# expect: {"cause": "unsafe-op", "phase": "backward", "op": "SqrtGrad", "module": "siamese/distance"}
# about: a siamese network scores pairs by the Euclidean distance sqrt(sum((a - b)^2)); a batch holding identical pairs gives distance 0, finite in the forward pass, but the gradient of sqrt at 0 is infinite.
import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(0)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)


class Distance(keras.layers.Layer):
    def call(self, a, b):
        return tf.sqrt(tf.reduce_sum(tf.square(a - b), axis=-1, keepdims=True))


rng = np.random.default_rng(0)
left = rng.standard_normal((256, 12)).astype("float32")
right = left + rng.standard_normal((256, 12)).astype("float32") * 0.5
right[100:104] = left[100:104]  # duplicate records: the same item on both sides
same = (rng.random((256, 1)) < 0.5).astype("float32")

encoder = keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, name="embed")], name="encoder")
a_in, b_in = keras.Input((12,), name="left"), keras.Input((12,), name="right")
dist = Distance(name="distance")(encoder(a_in), encoder(b_in))
model = keras.Model([a_in, b_in], dist, name="siamese")


def contrastive(y, d):
    return y * tf.square(d) + (1.0 - y) * tf.square(tf.maximum(1.0 - d, 0.0))


model.compile(optimizer=keras.optimizers.SGD(0.01), loss=contrastive)
history = model.fit([left, right], same, batch_size=32, epochs=2, shuffle=False, verbose=2)
print(f"final loss {history.history['loss'][-1]:.6g}")
