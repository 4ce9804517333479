"""Early warnings under Keras: the data look (``fit``'s arrays, the script's variables) and the
float16 headroom rule, in the session ``nanguard run`` installs (in process: no subprocess)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "tensorflow":  # pragma: no cover
    pytest.skip("the Keras adapter needs the TensorFlow backend", allow_module_level=True)

from nanguard import NonFiniteError  # noqa: E402
from nanguard.keras._datalook import _projected, fit_arrays  # noqa: E402
from nanguard.keras.session import KerasSession  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)


@pytest.fixture
def session() -> Iterator[KerasSession]:
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    s = KerasSession(policy="raise")
    s.install()
    try:
        yield s
    finally:
        s.uninstall()
        keras.config.set_dtype_policy("float32")


def _data(n: int = 256, d: int = 4) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, d)).astype("float32")
    return x, (x @ rng.standard_normal((d, 1))).astype("float32")


def _model(d: int = 4, opt: Any = None) -> Any:
    model = keras.Sequential([keras.Input((d,)), keras.layers.Dense(8, activation="relu", name="fc"),
                              keras.layers.Dense(1, name="head")], name="reg")
    model.compile(optimizer=opt or keras.optimizers.Adam(1e-2), loss="mse")
    return model


def _with_nan(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x[100, 2] = np.nan
    return x, y


def _warnings(s: KerasSession) -> list[dict[str, Any]]:
    return [w.to_dict() for w in s.guard.controller.early.warnings]


def test_a_nan_in_the_arrays_given_to_fit_is_warned_before_its_batch(session: KerasSession) -> None:
    x, y = _data()
    x[200, 1] = np.nan
    with pytest.raises(NonFiniteError):
        _model().fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    (w,) = _warnings(session)
    assert (w["step"], w["kind"], w["projected_step"]) == (0, "data-nonfinite", 200 // 32)
    assert w["message"].startswith("`x` (an argument of fit) holds 1 NaN in 1 of its 256 rows (first: row 200)")
    (ev,) = session.guard.findings
    assert ev[0].step == 200 // 32  # the warning's projection is the step that failed


def test_fit_arrays_in_a_dict_and_shuffled_data_project_no_step(session: KerasSession) -> None:
    x, y = _data()
    y[7, 0] = np.inf
    found = fit_arrays({"x": {"features": x}, "y": [y], "sample_weight": None})
    assert [(f.name, f.inf, f.first_row) for f in found] == [("y[0]", 1, 7)]
    x[3, 0] = np.nan
    with pytest.raises(NonFiniteError):
        _model().fit(x, y, batch_size=32, epochs=1, verbose=0)  # shuffle=True: no projection
    (w,) = _warnings(session)
    assert (w["kind"], w["projected_step"]) == ("data-nonfinite", None)
    assert "`x` (an argument of fit)" in w["message"] and any("y: float32[256, 1]" in e for e in w["evidence"])


@pytest.mark.parametrize(("fit", "projected"), [
    ({"batch_size": 32}, 6),
    ({"steps_per_epoch": 4}, 3),  # Keras's batch size: ceil(256 / 4) = 64
    ({"batch_size": 32, "steps_per_epoch": 2, "epochs": 3}, None),  # fit runs 6 steps: never read
    ({"batch_size": 32, "steps_per_epoch": 4, "epochs": 3}, 6),  # one iterator across the epochs
    ({"batch_size": 32, "validation_split": 0.25}, None),  # row 200 is in the validation tail
    ({"batch_size": 32, "validation_split": 0.5, "validation_data": ("xv", "yv")}, 6),  # split ignored
    ({"batch_size": 32, "shuffle": np.False_}, 6),
    ({"batch_size": 32, "shuffle": "batch"}, None),
])
def test_the_projected_step_is_the_batch_keras_reads_the_row_in(fit: dict[str, Any], projected: int | None) -> None:
    x, y = _data()
    x[200, 1] = np.nan
    (found,) = fit_arrays({"x": x, "y": y})
    assert _projected({"shuffle": False, **fit}, found, 0) == projected


def test_the_earliest_bad_row_is_projected_and_nested_inputs_are_read_leaf_by_leaf(session: KerasSession) -> None:
    x, y = _data()
    x[200, 1], y[70, 0] = np.nan, np.inf
    a, b = x[:, :2].copy(), x[:, 2:].copy()
    assert [(f.name, f.rows, f.total_rows, f.first_row) for f in fit_arrays({"x": {"in": [a, b]}})] == [
        ("x['in'][0]", 1, 256, 200)]
    with pytest.raises(NonFiniteError):
        _model().fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    (w,) = _warnings(session)
    assert w["projected_step"] == 70 // 32 and w["message"].startswith("`y` (an argument of fit) holds 1 Inf")
    assert session.guard.findings[0][0].step == 70 // 32


def test_arrays_read_at_one_fit_are_not_read_again() -> None:
    x, y = _data()
    x[5, 0] = np.nan
    looked: dict[int, Any] = {}
    assert [f.name for f in fit_arrays({"x": x, "y": y}, looked)] == ["x"]
    assert fit_arrays({"x": x, "y": y}, looked) == []
    assert [f.name for f in fit_arrays({"x": x.copy()}, looked)] == ["x"]


def test_mixed_float16_keeps_float32_variables_and_the_headroom_rule_off(session: KerasSession) -> None:
    keras.config.set_dtype_policy("mixed_float16")
    x, y = _data(64)
    _model(opt=keras.optimizers.SGD(1e-3)).fit(x, y, batch_size=32, epochs=1, verbose=0)
    assert session.guard.controller.early.low_max is None and _warnings(session) == []


def test_masks_and_clean_data_are_not_warned(session: KerasSession) -> None:
    x, y = _data()
    mask = np.triu(np.full((64, 64), -np.inf, dtype="float32"), k=1)  # non-finite by design
    assert fit_arrays({"x": mask}) == []
    _model().fit(x, y, batch_size=32, epochs=1, verbose=0)
    assert _warnings(session) == [] and session.guard.controller.early.low_max is None


def test_a_custom_loop_over_an_eager_tensor_is_warned_from_the_scripts_variables(session: KerasSession) -> None:
    x_all, y_all = (tf.constant(a) for a in _with_nan(*_data(128)))  # what the loop slices its batches from
    model, opt = _model(), keras.optimizers.SGD(1e-2)

    @tf.function
    def train_step(xb: Any, yb: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(xb, training=True) - yb) ** 2)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    with pytest.raises(NonFiniteError):
        for i in range(0, 128, 16):
            train_step(x_all[i:i + 16], y_all[i:i + 16])
    (w,) = _warnings(session)
    assert (w["step"], w["kind"]) == (0, "data-nonfinite")
    assert w["message"].startswith("`x_all` (the script's variables) holds 1 NaN in 1 of its 128 rows (first: row 100)")
    assert session.guard.findings[0][0].step == 100 // 16


def test_float16_variables_switch_the_headroom_rule_on(session: KerasSession) -> None:
    keras.config.set_dtype_policy("float16")
    x, y = _data(64)
    model = _model(opt=keras.optimizers.SGD(1e-7))
    model.fit(x, 100.0 * y, batch_size=32, epochs=1, verbose=0)  # a squared error in the 10^4s
    assert session.guard.controller.early.low_max == 65504.0
    kinds = [w["kind"] for w in _warnings(session)]
    assert kinds == ["low-precision-headroom"]


def test_adam_with_epsilon_zero_is_warned_when_fit_adopts_it(session: KerasSession) -> None:
    x, y = _data()
    _model(opt=keras.optimizers.Adam(1e-3, epsilon=0.0)).fit(x, y, epochs=1, verbose=0)
    (w,) = _warnings(session)
    assert (w["step"], w["kind"]) == (0, "optimizer-eps-zero")
    assert w["message"].startswith("`keras.optimizers.Adam(epsilon=0)`: its update divides")


def test_adam_with_its_default_epsilon_is_not_warned(session: KerasSession) -> None:
    x, y = _data()
    _model(opt=keras.optimizers.Adam(1e-3)).fit(x, y, epochs=1, verbose=0)
    assert _warnings(session) == []
