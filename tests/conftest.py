"""Shared test set-up: deterministic CPU torch (one thread: reduction order fixed), and the two
tiers of the suite.

* the default tier (``pytest``): the core's rules with plain numbers, every adapter's
  fault-injection tests, the commands on small inputs — a few minutes on 2 cores;
* the end-to-end tier (``pytest -m slow``): the labelled scenario suites (torch, held-out,
  Keras held-out) and the recovery suite through ``nanguard run``, every other test that runs
  ``nanguard run`` on a script in a fresh process, the report in a real browser, 2-process DDP,
  the benchmarks' smoke runs, a 1 GB scan — tests marked ``slow``, every test of the modules in
  :data:`END_TO_END`, and the tests in :data:`END_TO_END_TESTS`.

``make test`` (and ``.ci/run``) runs both. No verdict depends on the machine's load: timeouts
are hang guards (600 s for runs that take seconds), and nothing asserts a duration.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("PYTHONHASHSEED", "0")

#: test modules that belong to the end-to-end tier as a whole
END_TO_END = frozenset({
    "test_scenarios.py", "test_recovery_suite.py", "test_browser.py", "test_benchmarks.py",
    "test_distributed.py", "test_run.py", "test_run_outputs.py",
})

#: single tests elsewhere that run `nanguard run` in a fresh process (10–20 s each)
END_TO_END_TESTS = frozenset({
    "test_keras.py::test_nanguard_run_on_a_keras_fit_script_exits_3_with_a_json_log",
    "test_keras.py::test_nanguard_run_guards_a_tensorflow_custom_loop",
    "test_report.py::test_nanguard_run_writes_report_json_and_tensorboard",
})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in END_TO_END or f"{item.path.name}::{item.name}" in END_TO_END_TESTS:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _deterministic() -> None:
    try:
        import torch
    except ImportError:  # a TensorFlow-only environment: the Keras tests still run
        return
    torch.manual_seed(0)
    torch.set_num_threads(1)
