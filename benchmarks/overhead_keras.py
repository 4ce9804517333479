"""Overhead of nanguard on healthy Keras 3 / TensorFlow training, against check_numerics.

Usage::

    python benchmarks/overhead_keras.py            # the table (about a minute on 2 CPU cores)
    python benchmarks/overhead_keras.py --quick    # CI smoke run

For each model, ``model.fit`` runs round-robin in three variants — plain, with the
``nanguard.keras.NanGuard`` callback, and under ``tf.debugging.enable_check_numerics()`` — and a
callback records the wall time of every batch; the table gives each variant's median step time as
a ratio to plain ``fit``. Timing is never asserted anywhere: this prints numbers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

import nanguard.keras


class _Timer(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []
        self._t = 0.0

    def on_train_batch_begin(self, batch: int, logs: object = None) -> None:
        self._t = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        self.times.append(time.perf_counter() - self._t)


def mlp(width: int) -> keras.Model:
    return keras.Sequential([
        keras.Input((64,)), keras.layers.Dense(width, activation="relu"),
        keras.layers.Dense(width, activation="relu"), keras.layers.Dense(10),
    ])


def cnn(width: int) -> keras.Model:
    return keras.Sequential([
        keras.Input((32, 32, 3)), keras.layers.Conv2D(width, 3, padding="same"),
        keras.layers.BatchNormalization(), keras.layers.ReLU(), keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(2 * width, 3, padding="same"), keras.layers.BatchNormalization(),
        keras.layers.ReLU(), keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10),
    ])


CASES: list[tuple[str, str, Callable[[], keras.Model], tuple[int, ...], int]] = [
    ("MLP", "S", lambda: mlp(128), (64,), 64),
    ("MLP", "L", lambda: mlp(1024), (64,), 128),
    ("CNN+BN", "S", lambda: cnn(16), (32, 32, 3), 32),
    ("CNN+BN", "L", lambda: cnn(48), (32, 32, 3), 64),
]


def fit_once(model: keras.Model, variant: str, x: np.ndarray, y: np.ndarray, batch: int, steps: int) -> float:
    timer = _Timer()
    callbacks: list[keras.callbacks.Callback] = [timer]
    if variant == "nanguard":
        callbacks.append(nanguard.keras.NanGuard())
    if variant == "check_numerics":
        tf.debugging.enable_check_numerics()
    try:
        model.fit(x[: batch * steps], y[: batch * steps], batch_size=batch, epochs=1,
                  verbose=0, shuffle=False, callbacks=callbacks)
    finally:
        if variant == "check_numerics":
            tf.debugging.disable_check_numerics()
    return statistics.median(timer.times[1:] or timer.times)  # the first batch traces the step


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    args = p.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 5)
    steps = args.steps or (4 if args.quick else 20)
    variants = ["plain", "nanguard", "check_numerics"]
    print(f"# python benchmarks/overhead_keras.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    print(f"# tensorflow {tf.__version__}, keras {keras.__version__}, CPU, {repeats} round-robin "
          f"repeats x {steps} steps, median step time")
    print()
    print("| model | size | plain fit ms/step | nanguard callback | enable_check_numerics |")
    print("|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for name, size, build, shape, batch in CASES:
        if args.quick and size == "L":
            continue
        keras.utils.set_random_seed(0)
        x = rng.standard_normal((batch * steps, *shape)).astype("float32")
        y = rng.integers(0, 10, batch * steps)
        models = {}
        for v in variants:  # one model per variant: a guard's check is traced into the step
            m = build()
            m.compile(optimizer=keras.optimizers.Adam(1e-4),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            fit_once(m, v, x, y, batch, 2)  # warm up: trace and compile
            models[v] = m
        times: dict[str, list[float]] = {v: [] for v in variants}
        for r in range(repeats):
            for v in variants[r % 3:] + variants[: r % 3]:
                times[v].append(fit_once(models[v], v, x, y, batch, steps))
        med = {v: statistics.median(t) for v, t in times.items()}
        print(f"| {name} | {size} | {med['plain'] * 1e3:.2f} | {med['nanguard'] / med['plain']:.3f}x | "
              f"{med['check_numerics'] / med['plain']:.3f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
