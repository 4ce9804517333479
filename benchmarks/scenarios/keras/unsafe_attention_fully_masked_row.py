# expect: {"cause": "unsafe-op", "phase": "forward", "op": ["SelectV2", "AddV2", "Softmax"], "module": "encoder/attention"}
# about: a hand-written attention layer masks padding keys with -inf before the softmax; a sequence that is all padding has every key masked, softmax over a row of -inf is 0/0 = NaN, and it reaches the loss.
import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(0)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)


class MaskedAttention(keras.layers.Layer):
    def __init__(self, dim, **kwargs):
        super().__init__(**kwargs)
        self.q = keras.layers.Dense(dim, name="q")
        self.k = keras.layers.Dense(dim, name="k")
        self.v = keras.layers.Dense(dim, name="v")
        self.dim = dim

    def call(self, x, key_mask):
        scores = tf.matmul(self.q(x), self.k(x), transpose_b=True) / self.dim**0.5
        scores = tf.where(key_mask[:, None, :], scores, float("-inf"))  # padding keys
        return tf.matmul(tf.nn.softmax(scores, axis=-1), self.v(x))


rng = np.random.default_rng(0)
n, t, d = 256, 10, 8
lengths = rng.integers(1, t + 1, size=n)
lengths[70] = 0  # an empty document: nothing but padding
tokens = rng.standard_normal((n, t, d)).astype("float32")
mask = np.arange(t)[None, :] < lengths[:, None]
y = rng.integers(0, 2, size=(n, 1)).astype("float32")

x_in, m_in = keras.Input((t, d), name="tokens"), keras.Input((t,), dtype="bool", name="mask")
h = MaskedAttention(16, name="attention")(x_in, m_in)
out = keras.layers.Dense(1, name="head")(keras.layers.GlobalAveragePooling1D(name="pool")(h))
model = keras.Model([x_in, m_in], out, name="encoder")
model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=keras.losses.BinaryCrossentropy(from_logits=True))
history = model.fit([tokens, mask], y, batch_size=32, epochs=2, shuffle=False, verbose=2)
print(f"final loss {history.history['loss'][-1]:.6g}")
