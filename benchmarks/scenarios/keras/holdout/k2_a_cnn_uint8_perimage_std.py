# expect: {"cause": "nonfinite-input", "phase": "data", "op": "input", "module": "shapes/stem"}
# about: held out (Keras, round 2): written after the code by someone who had not read it or the suite. uint8 images are standardised per image in numpy ((x - mean) / std); one frame is a flat grey card, its std is 0 so the whole image becomes 0/0 = NaN before model.fit ever sees it; the first layer to consume it is the Conv2D 'stem'.
import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(0)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

rng = np.random.default_rng(3)
raw = rng.integers(0, 256, size=(192, 12, 12, 3), dtype=np.uint8)
raw[77] = 128  # a calibration card: one flat grey value
labels = (raw[..., 0].astype("float32").mean(axis=(1, 2)) > raw[..., 2].astype("float32").mean(axis=(1, 2))).astype("int32")

x = raw.astype("float32")
x = (x - x.mean(axis=(1, 2, 3), keepdims=True)) / x.std(axis=(1, 2, 3), keepdims=True)

model = keras.Sequential(
    [
        keras.Input((12, 12, 3)),
        keras.layers.Conv2D(8, 3, activation="relu", name="stem"),
        keras.layers.Conv2D(8, 3, activation="relu", name="block"),
        keras.layers.Flatten(),
        keras.layers.Dense(2, activation="softmax", name="probs"),
    ],
    name="shapes",
)
model.compile(optimizer="rmsprop", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
hist = model.fit(x, labels, batch_size=16, epochs=2, shuffle=False, verbose=2)
print(f"final loss {hist.history['loss'][-1]:.6g}")
