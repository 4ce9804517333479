# expect: {"healthy": true}
# about: held out (Keras, round 2): written after the code by someone who had not read it or the suite. an imbalanced 3-class MLP with BatchNormalization, Dropout, class_weight and a LearningRateScheduler callback (step decay), validation_split; nothing non-finite anywhere, output must be unchanged.
import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(0)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

rng = np.random.default_rng(12)
x = rng.standard_normal((600, 20)).astype("float32")
score = x[:, 0] + 0.5 * x[:, 1]
y = np.where(score > 1.2, 2, np.where(score > 0.6, 1, 0)).astype("int32")
counts = np.bincount(y, minlength=3)
class_weight = {i: float(len(y) / (3 * c)) for i, c in enumerate(counts)}


def schedule(epoch, lr):
    return lr * 0.5 if epoch and epoch % 2 == 0 else lr


model = keras.Sequential(
    [
        keras.Input((20,)),
        keras.layers.Dense(64, name="d1"),
        keras.layers.BatchNormalization(name="bn1"),
        keras.layers.Activation("relu"),
        keras.layers.Dropout(0.3),
        keras.layers.Dense(32, activation="relu", name="d2"),
        keras.layers.Dropout(0.2),
        keras.layers.Dense(3, activation="softmax", name="out"),
    ],
    name="imbalanced",
)
model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
hist = model.fit(
    x, y, batch_size=32, epochs=5, validation_split=0.2, class_weight=class_weight,
    callbacks=[keras.callbacks.LearningRateScheduler(schedule, verbose=1)], verbose=2,
)
print("lr history", [float(v) for v in hist.history["learning_rate"]])
print(f"final loss {hist.history['loss'][-1]:.6g} val {hist.history['val_loss'][-1]:.6g}")
print("eval", [round(float(v), 5) for v in model.evaluate(x[:100], y[:100], verbose=0)])
