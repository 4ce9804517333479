# expect: {"cause": "nonfinite-parameters", "phase": "forward", "op": "parameter", "module": "churn/head"}
# about: held out (Keras, round 2): written after the code by someone who had not read it or the suite. 'pretrained' weights for the head are imported from a numpy export with layer.set_weights; one kernel entry is inf (a diverged export), set_weights accepts it silently, and the first forward pass multiplies by an already non-finite weight.
import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(0)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

rng = np.random.default_rng(8)
x = rng.standard_normal((300, 10)).astype("float32")
y = (x[:, 2] - x[:, 5] > 0).astype("float32")

model = keras.Sequential(
    [
        keras.Input((10,)),
        keras.layers.Dense(24, activation="relu", name="features"),
        keras.layers.Dense(1, name="head"),
    ],
    name="churn",
)
exported = {"kernel": rng.standard_normal((24, 1)).astype("float32") * 0.1, "bias": np.zeros(1, "float32")}
exported["kernel"][13, 0] = np.inf  # written by a run that had diverged
model.get_layer("head").set_weights([exported["kernel"], exported["bias"]])

model.compile(optimizer=keras.optimizers.SGD(0.01), loss=keras.losses.BinaryCrossentropy(from_logits=True))
hist = model.fit(x, y, batch_size=30, epochs=2, verbose=2)
print(f"final loss {hist.history['loss'][-1]:.6g}")
