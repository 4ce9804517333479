# expect: {"cause": "bad-initialization", "phase": "forward", "op": "MatMul", "module": ["tower/fc27", "tower/fc28", "tower/fc29", "tower/fc30", "tower/fc31", "tower/fc32"]}
# about: held out (Keras, round 2): written after the code by someone who had not read it or the suite. a 32-layer functional ReLU MLP (width 256) built in a loop with kernel_initializer=RandomNormal(stddev=2); each layer multiplies the activation RMS by ~2*sqrt(256)/sqrt(2) = 22.6, so after ~28 layers a MatMul exceeds 3.4e38 on the very first forward pass; the loss is a from_logits cross-entropy (log-sum-exp) so the loss itself does not overflow earlier.
import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(0)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

rng = np.random.default_rng(0)
x = rng.standard_normal((256, 16)).astype("float32")
y = (x[:, 0] * x[:, 1] > 0).astype("int32")

init = keras.initializers.RandomNormal(mean=0.0, stddev=2.0, seed=1)
inp = keras.Input((16,))
h = inp
for i in range(1, 33):
    h = keras.layers.Dense(256, activation="relu", kernel_initializer=init, name=f"fc{i}")(h)
out = keras.layers.Dense(2, name="logits")(h)
model = keras.Model(inp, out, name="tower")
model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
hist = model.fit(x, y, batch_size=32, epochs=1, verbose=2)
print(f"final loss {hist.history['loss'][-1]:.6g}")
