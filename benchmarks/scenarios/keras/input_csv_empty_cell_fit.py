# expect: {"cause": "nonfinite-input", "phase": "data", "op": "input", "module": "house_prices/hidden"}
# about: a regression on a CSV read with np.genfromtxt; one row has an empty cell, which becomes NaN, and model.fit trains on the arrays as they are.
import io
import os

import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(0)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)

rng = np.random.default_rng(0)
rows = ["area,rooms,age,price"]
for i in range(512):
    area, rooms, age = rng.uniform(30, 200), rng.integers(1, 6), rng.uniform(0, 80)
    price = 3.0 * area + 20.0 * rooms - 0.5 * age + rng.normal(0, 5)
    cells = [f"{area:.1f}", str(rooms), f"{age:.1f}", f"{price:.1f}"]
    if i == 300:
        cells[2] = ""  # the age of this house was never entered
    rows.append(",".join(cells))
table = np.genfromtxt(io.StringIO("\n".join(rows)), delimiter=",", skip_header=1, dtype="float32")
x, y = table[:, :3], table[:, 3:]
if FIXED:  # drop the rows with a missing cell
    keep = np.isfinite(table).all(axis=1)
    x, y = x[keep], y[keep]
x = (x - np.nanmean(x, axis=0)) / np.nanstd(x, axis=0)
y = (y - y.mean()) / y.std()

model = keras.Sequential(
    [keras.Input((3,)), keras.layers.Dense(32, activation="relu", name="hidden"), keras.layers.Dense(1, name="price")],
    name="house_prices",
)
model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
history = model.fit(x, y, batch_size=32, epochs=3, verbose=2)
print(f"final loss {history.history['loss'][-1]:.6g}")
