# expect: {"healthy": true}
# about: held out (Keras, round 2): written after the code by someone who had not read it or the suite. keras.layers.MultiHeadAttention with an explicit boolean attention_mask [B, T, S] in which some query rows mask every key; Keras' Softmax replaces masked scores with -1e9 (finite), so a fully masked row is a uniform softmax which Keras then zeroes with where(mask, p, 0): no NaN anywhere, forward or backward.
import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(0)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

rng = np.random.default_rng(9)
n, t, d = 128, 10, 8
seq = rng.standard_normal((n, t, d)).astype("float32")
mask = np.ones((n, t, t), dtype=bool)
mask[:, 3, :] = False  # query position 3 may attend to nothing
mask[::4, :, 6:] = False  # keys 6.. are padding in every 4th sequence
y = (seq[:, :, 0].sum(axis=1) > 0).astype("float32")

x_in = keras.Input((t, d), name="seq")
m_in = keras.Input((t, t), dtype="bool", name="mask")
att = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, name="mha")(x_in, x_in, attention_mask=m_in)
h = keras.layers.GlobalAveragePooling1D()(att)
out = keras.layers.Dense(1, activation="sigmoid", name="cls")(h)
model = keras.Model([x_in, m_in], out, name="masked_attn")
model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="binary_crossentropy", metrics=["accuracy"])
hist = model.fit([seq, mask], y, batch_size=32, epochs=3, verbose=2)
print(f"final loss {hist.history['loss'][-1]:.6g}")
