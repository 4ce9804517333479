# expect: {"cause": "nonfinite-input", "phase": "data", "op": "input", "module": "digits/conv1"}
# about: a tf.data pipeline scales each image by its own maximum; a blank frame divides 0 by 0 inside dataset.map, and the NaN image reaches a small CNN trained with model.fit.
import os

import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(0)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)

rng = np.random.default_rng(1)
images = rng.integers(0, 256, size=(256, 16, 16, 1)).astype("float32")
images[150] = 0.0  # a blank frame from the camera
labels = (images.mean(axis=(1, 2, 3)) > 127.5).astype("int32")


def scale(img, label):
    if FIXED:  # a blank frame stays blank
        return img / tf.maximum(tf.reduce_max(img), 1.0), label
    return img / tf.reduce_max(img), label  # 0 / 0 for a blank frame


ds = tf.data.Dataset.from_tensor_slices((images, labels)).map(scale).batch(32)
model = keras.Sequential(
    [
        keras.Input((16, 16, 1)),
        keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="conv1"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu", name="conv2"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(2, name="head"),
    ],
    name="digits",
)
model.compile(
    optimizer=keras.optimizers.SGD(0.05),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
)
history = model.fit(ds, epochs=2, verbose=2)
print(f"final loss {history.history['loss'][-1]:.6g}")
