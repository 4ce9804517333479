# expect: {"healthy": true}
# about: a tiny causal self-attention model masks future positions with -inf in a custom layer (tf.where with float('-inf')); every row keeps at least one key, so softmax absorbs the -inf and nothing non-finite reaches the loss.
import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(0)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)


class CausalAttention(keras.layers.Layer):
    def __init__(self, dim, **kwargs):
        super().__init__(**kwargs)
        self.qkv = keras.layers.Dense(3 * dim, name="qkv")
        self.dim = dim

    def call(self, x):
        q, k, v = tf.split(self.qkv(x), 3, axis=-1)
        t = tf.shape(x)[1]
        causal = tf.linalg.band_part(tf.ones((t, t), dtype=tf.bool), -1, 0)
        scores = tf.matmul(q, k, transpose_b=True) / self.dim**0.5
        scores = tf.where(causal, scores, float("-inf"))
        return tf.matmul(tf.nn.softmax(scores, axis=-1), v)


rng = np.random.default_rng(0)
x = rng.standard_normal((256, 10, 8)).astype("float32")
y = np.cumsum(x[..., :1], axis=1).astype("float32")  # a causal target

model = keras.Sequential(
    [keras.Input((10, 8)), CausalAttention(16, name="attn"), keras.layers.Dense(1, name="out")],
    name="causal",
)
model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
history = model.fit(x, y, batch_size=32, epochs=3, verbose=2)
print(f"final loss {history.history['loss'][-1]:.6g}")
