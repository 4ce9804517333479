# expect: {"cause": "unsafe-op", "phase": "forward", "op": "Log", "module": "classifier/log_probs"}
# about: a custom layer computes log(softmax(logits)) by hand; large logits make softmax underflow to exactly 0 for some classes and the log gives -inf, which reaches the NLL loss.
import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(0)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)


class LogProbs(keras.layers.Layer):
    def call(self, logits):
        return tf.math.log(tf.nn.softmax(logits, axis=-1))


def nll(y_true, log_probs):
    onehot = tf.one_hot(tf.cast(tf.reshape(y_true, [-1]), tf.int32), 10)
    return -tf.reduce_sum(onehot * log_probs, axis=-1)


rng = np.random.default_rng(0)
x = (rng.standard_normal((512, 20)) * 40).astype("float32")  # unnormalised features
y = rng.integers(0, 10, size=(512, 1)).astype("int32")
model = keras.Sequential(
    [
        keras.Input((20,)),
        keras.layers.Dense(64, activation="relu", name="hidden"),
        keras.layers.Dense(10, name="logits"),
        LogProbs(name="log_probs"),
    ],
    name="classifier",
)
model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=nll)
history = model.fit(x, y, batch_size=64, epochs=5, verbose=2)
print(f"final loss {history.history['loss'][-1]:.6g}")
