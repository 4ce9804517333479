# expect: {"healthy": true}
# about: a CNN with BatchNormalization and Dropout trained with model.fit (SGD with momentum), validated every epoch and evaluated in inference mode.
import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(0)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

rng = np.random.default_rng(0)
x = rng.standard_normal((384, 12, 12, 3)).astype("float32")
y = (x[:, :6].mean(axis=(1, 2, 3)) > x[:, 6:].mean(axis=(1, 2, 3))).astype("int32")

model = keras.Sequential(
    [
        keras.Input((12, 12, 3)),
        keras.layers.Conv2D(16, 3, padding="same", use_bias=False, name="conv1"),
        keras.layers.BatchNormalization(name="bn1"),
        keras.layers.ReLU(name="relu1"),
        keras.layers.MaxPooling2D(name="pool1"),
        keras.layers.Conv2D(32, 3, padding="same", use_bias=False, name="conv2"),
        keras.layers.BatchNormalization(name="bn2"),
        keras.layers.ReLU(name="relu2"),
        keras.layers.GlobalAveragePooling2D(name="gap"),
        keras.layers.Dropout(0.2, name="drop"),
        keras.layers.Dense(2, name="head"),
    ],
    name="bn_cnn",
)
model.compile(
    optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
)
history = model.fit(x[:320], y[:320], batch_size=32, epochs=3, validation_data=(x[320:], y[320:]), verbose=2)
print("evaluate", model.evaluate(x[320:], y[320:], verbose=0))
print(f"final loss {history.history['loss'][-1]:.6g}")
