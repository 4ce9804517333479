# expect: {"cause": "optimizer-state", "phase": "optimizer", "op": "Adam.apply", "module": "review_lstm/tok_embed"}
# about: held out (Keras, round 2): written after the code by someone who had not read it or the suite. an Embedding+LSTM sentiment model with Adam(epsilon=0); the vocabulary has 64 rows but the corpus only uses ids 1..47, so rows 48..63 get an exactly-zero gradient; Adam's first update there is m_hat/(sqrt(v_hat)+0) = 0/0 = NaN in the embedding table, with all gradients finite.
import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(0)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

rng = np.random.default_rng(11)
vocab, seqlen, n = 64, 12, 256
tokens = rng.integers(1, 48, size=(n, seqlen)).astype("int32")  # ids 48..63 never occur
label = (tokens[:, :6].mean(axis=1) > 24).astype("float32")

model = keras.Sequential(
    [
        keras.Input((seqlen,), dtype="int32"),
        keras.layers.Embedding(vocab, 16, name="tok_embed"),
        keras.layers.LSTM(16, name="lstm"),
        keras.layers.Dense(1, activation="sigmoid", name="out"),
    ],
    name="review_lstm",
)
model.compile(optimizer=keras.optimizers.Adam(learning_rate=2e-3, epsilon=0.0), loss="binary_crossentropy", metrics=["accuracy"])
hist = model.fit(tokens, label, batch_size=32, epochs=2, verbose=2)
print(f"final loss {hist.history['loss'][-1]:.6g}")
