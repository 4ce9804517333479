"""Shared test set-up: deterministic CPU torch (one thread: reduction order fixed), and the two
tiers of the suite.

* the default tier (``pytest``): the core's rules with plain numbers, every adapter's
  fault-injection tests, the commands on small inputs — a few minutes on 2 cores;
* the end-to-end tier (``pytest -m slow``): every test that starts a fresh process — ``nanguard
  run`` on a script, the report in a real browser, 2-process DDP, the benchmarks' smoke runs, a
  1 GB scan, an import with a framework hidden. Such a test gets its process from the
  :func:`spawn` fixture (``tests/_spawn.py``), and :func:`pytest_collection_modifyitems` marks
  every test that uses it, directly or through another fixture, ``slow``. The labelled scenario
  suites and the recovery suite (their runs are started by ``benchmarks/diagnose.py`` and
  ``benchmarks/recovery.py``) are marked ``slow`` in their modules.

``make test`` (and ``.ci/run``) runs both. No verdict depends on the machine's load: timeouts
are hang guards (600 s for runs that take seconds), and nothing asserts a duration.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from _spawn import Spawn

os.environ.setdefault("PYTHONHASHSEED", "0")
# an error inside nanguard's own work (a replay, a trial) is raised, not reported as "ours"
# (core.errors.internal_error): a bug fails the test that meets it
os.environ.setdefault("NANGUARD_STRICT", "1")


@pytest.fixture(scope="session")
def spawn() -> Iterator[Spawn]:
    """Starts a fresh process (``spawn.nanguard(...)``, ``spawn.python(...)``, ``spawn.run(argv)``,
    ``spawn.popen(...)``); a test that uses it is in the end-to-end tier."""
    spawner = Spawn()
    yield spawner
    spawner.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "spawn" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _deterministic() -> None:
    try:
        import torch
    except ImportError:  # a TensorFlow-only environment: the Keras tests still run
        return
    torch.manual_seed(0)
    torch.set_num_threads(1)
