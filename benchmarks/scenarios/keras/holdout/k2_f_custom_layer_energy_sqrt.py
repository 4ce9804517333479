# expect: {"cause": "unsafe-op", "phase": "backward", "op": "SqrtGrad", "module": "vad/frame_energy"}
# about: held out (Keras, round 2): written after the code by someone who had not read it or the suite. a voice-activity model: a bias-free Dense projects each audio frame, a custom keras.layers.Layer appends its energy ops.sqrt(ops.sum(x**2)); silent (all-zero) frames project to exactly 0, so the energy is sqrt(0) = 0 (finite forward) but its gradient 0.5/sqrt(0) is inf, and SqrtGrad makes inf/NaN in the backward pass.
import keras
import numpy as np
import tensorflow as tf
from keras import ops

keras.utils.set_random_seed(0)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)


class FrameEnergy(keras.layers.Layer):
    def call(self, x):
        energy = ops.sqrt(ops.sum(x**2, axis=-1, keepdims=True))
        return ops.concatenate([x, energy], axis=-1)


rng = np.random.default_rng(4)
frames = rng.standard_normal((320, 40)).astype("float32")
frames[::9] = 0.0  # digital silence
speech = (np.abs(frames).sum(axis=1) > 30).astype("float32")

model = keras.Sequential(
    [
        keras.Input((40,)),
        keras.layers.Dense(16, use_bias=False, name="proj"),
        FrameEnergy(name="frame_energy"),
        keras.layers.Dense(1, activation="sigmoid", name="is_speech"),
    ],
    name="vad",
)
model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="binary_crossentropy")
hist = model.fit(frames, speech, batch_size=32, epochs=2, verbose=2)
print(f"final loss {hist.history['loss'][-1]:.6g}")
