"""The benchmarks run (smoke runs with tiny sizes). Timing is never asserted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from _spawn import Spawn

ROOT = Path(__file__).resolve().parent.parent


def test_overhead_benchmark_runs_and_prints_its_tables(spawn: Spawn) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = spawn.python(
        "benchmarks/overhead.py", "--quick", "--repeats", "1", "--steps", "2", "--no-memory",
        cwd=ROOT, timeout=600, env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert "| model | size | plain ms/step | floor | watch | trace | detect_anomaly |" in out
    assert "| REINFORCE, 20 no_grad env steps per update |" in out
    assert "| REINFORCE as pytorch/examples, 20 env steps with grad per update |" in out
    assert "| tiny loop, whole run | plain s | floor | watch | detect_anomaly |" in out
    assert "| logistic regression, hand-written update, 300 steps |" in out
    for model in ("MLP", "CNN+BN", "Transformer", "LSTM"):
        assert f"| {model} | S |" in out
    assert "replay: failure → finding, in plain steps" in out


def test_keras_overhead_benchmark_runs(spawn: Spawn) -> None:
    pytest.importorskip("tensorflow")
    pytest.importorskip("keras")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = spawn.python(
        "benchmarks/overhead_keras.py", "--quick", "--steps", "3",
        cwd=ROOT, timeout=600, env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| model | size | plain fit ms/step | nanguard callback | enable_check_numerics |" in r.stdout
    assert "| MLP | S |" in r.stdout and "| CNN+BN | S |" in r.stdout


def test_watch_profile_prints_the_parts_and_the_ablation(spawn: Spawn) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = spawn.python(
        "benchmarks/watch_profile.py", "--steps", "3", "--repeats", "1",
        cwd=ROOT, timeout=600, env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    for part in ("| zero_grad |", "| forward |", "| loss |", "| backward |", "| step |", "| **all** |"):
        assert part in r.stdout
    assert "| + the tape of ops outside modules |" in r.stdout


def test_scan_wide_prints_time_against_columns(spawn: Spawn) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    r = spawn.python(
        "benchmarks/scan_wide.py", "--max-columns", "5000", "--repeats", "1",
        cwd=ROOT, timeout=600, env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| columns | cells | file | seconds | µs per cell | NaN found |" in r.stdout
    assert "| 5,000 | 10,000 |" in r.stdout and "| NO |" not in r.stdout


def test_recurrence_gain_prints_a_row_per_cell_init_and_loss(spawn: Spawn) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    r = spawn.python(
        "benchmarks/recurrence_gain.py", "--length", "12",
        cwd=ROOT, timeout=600, env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [line for line in r.stdout.splitlines() if line.startswith("| ") and "×" in line]
    assert len(rows) == 3 * 6 * 2
    assert "| RNNCell (tanh) | default | last output | ×0." in r.stdout  # the default init shrinks it


def test_advice_benchmark_applies_a_learning_rate_fix_through_the_scripts_own_flag(spawn: Spawn) -> None:
    """One held-out learning-rate script: its first fix is run as ``--lr X`` and compared with
    the sane version."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import advice

    assert advice.apply_first_fix("run it again with `--lr 0.05` (it was `--lr 5`): ...", Path("x.py")) == [
        "--lr", "0.05"]
    script = ROOT / "benchmarks/scenarios/holdout_lr/r01_sgd_mlp_regression_lr_5.py"
    assert advice.apply_first_fix("opt = torch.optim.SGD(model.parameters(), lr=0.05)  # was 5", script) == [
        "--lr", "0.05"]
    assert advice.apply_first_fix("y = (y - y.mean()) / y.std()", script) is None
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    r = spawn.python("benchmarks/advice.py", "--framework", "holdout-lr", "--only", "r01_", "--jobs", "1",
                     cwd=ROOT, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| `r01_sgd_mlp_regression_lr_5` | learning-rate-too-high |" in r.stdout, r.stdout
    assert "first fixes applied from the command line: 1/1" in r.stdout


def test_the_two_rank_check_of_gpu_check_runs_on_gloo(spawn: Spawn, tmp_path: Path) -> None:
    """``benchmarks/gpu_ranks.py`` (NCCL where there are 2 GPUs) on the CPU: rank 1's log(0) is
    credited to rank 1 on both ranks, the step skipped on both, one model."""
    pytest.importorskip("torch.distributed.fsdp")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {k: v for k, v in os.environ.items() if not k.startswith("NANGUARD_")} | {"OMP_NUM_THREADS": "1"}
    script = str(ROOT / "benchmarks" / "gpu_ranks.py")
    r = spawn.python("-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", port,
                     "-m", "nanguard", "run", "--policy", "skip", "--json", "ranks.json", script,
                     cwd=tmp_path, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    t = spawn.python(script, "--table", "ranks.json", cwd=tmp_path, timeout=60, env=env)
    rows = [line for line in t.stdout.splitlines() if line.startswith("| 0 ") or line.startswith("| 1 ")]
    assert len(rows) == 2 and all("| gloo | cpu | (3, aten.log.default, rank 1) |" in row for row in rows), t.stdout
    assert rows[0].split("|")[-2] == rows[1].split("|")[-2]  # the same weight sum: one model
