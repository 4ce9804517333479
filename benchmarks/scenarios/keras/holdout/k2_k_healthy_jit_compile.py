# expect: {"healthy": true}
# about: held out (Keras, round 2): written after the code by someone who had not read it or the suite. a small Conv1D regressor compiled with jit_compile=True (XLA on CPU) and AdamW; healthy, output must be unchanged.
import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(0)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

rng = np.random.default_rng(13)
x = rng.standard_normal((256, 32, 2)).astype("float32")
y = (x[:, :, 0].mean(axis=1) - 0.5 * x[:, :, 1].std(axis=1)).astype("float32")[:, None]

model = keras.Sequential(
    [
        keras.Input((32, 2)),
        keras.layers.Conv1D(8, 5, activation="gelu", name="conv"),
        keras.layers.GlobalMaxPooling1D(),
        keras.layers.Dense(16, activation="relu", name="fc"),
        keras.layers.Dense(1, name="out"),
    ],
    name="xla_reg",
)
model.compile(optimizer=keras.optimizers.AdamW(3e-3, weight_decay=1e-3), loss="mse", metrics=["mae"], jit_compile=True)
hist = model.fit(x, y, batch_size=32, epochs=4, verbose=2)
print(f"final loss {hist.history['loss'][-1]:.6g}")
print("pred", np.round(model.predict(x[:3], verbose=0).ravel(), 5).tolist())
