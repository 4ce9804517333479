# expect: {"healthy": true}
# about: a text classifier with Embedding(mask_zero=True), MultiHeadAttention with a padding attention mask and a masked LSTM; Keras turns masked scores into large negatives and sequences that are mostly padding train normally.
import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(0)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

rng = np.random.default_rng(0)
n, t, vocab = 256, 12, 50
lengths = rng.integers(1, t + 1, size=n)
tokens = rng.integers(1, vocab, size=(n, t))
tokens[np.arange(t)[None, :] >= lengths[:, None]] = 0  # padding
y = (tokens[:, 0] % 2).astype("float32")[:, None]

inp = keras.Input((t,), dtype="int32", name="tokens")
emb = keras.layers.Embedding(vocab, 16, mask_zero=True, name="embed")(inp)
pad = keras.ops.not_equal(inp, 0)
att_mask = keras.ops.logical_and(pad[:, :, None], pad[:, None, :])
att = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8, name="mha")(emb, emb, attention_mask=att_mask)
h = keras.layers.LSTM(16, name="lstm")(keras.layers.Add(name="residual")([emb, att]))
out = keras.layers.Dense(1, name="head")(h)
model = keras.Model(inp, out, name="masked_text")
model.compile(optimizer=keras.optimizers.Adam(3e-3), loss=keras.losses.BinaryCrossentropy(from_logits=True))
history = model.fit(tokens, y, batch_size=32, epochs=3, verbose=2)
print(f"final loss {history.history['loss'][-1]:.6g}")
