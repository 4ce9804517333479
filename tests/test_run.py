"""`nanguard run` on unmodified scripts: behaviour, exit status, JSON run log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

from _spawn import Spawn

ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def _script(tmp_path: Path, body: str, name: str = "train.py") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return p


def _ng(spawn: Spawn, tmp_path: Path, *args: str,
        timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return spawn.nanguard("run", *args, cwd=tmp_path, timeout=timeout, env=ENV)


HEALTHY = """
    import sys
    import torch, torch.nn as nn, torch.nn.functional as F
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    for step in range(int(sys.argv[1])):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        print(f"{step} {loss.item()!r}")
    if __name__ == "__main__":
        print("main", sys.argv[1:])
"""


def test_healthy_script_output_is_unchanged_bit_for_bit(tmp_path: Path, spawn: Spawn) -> None:
    script = _script(tmp_path, HEALTHY)
    plain = spawn.python(str(script), "20", cwd=tmp_path, env=ENV, timeout=600)
    guarded = _ng(spawn, tmp_path, "--json", "log.json", "train.py", "20")
    assert plain.returncode == guarded.returncode == 0
    assert guarded.stdout == plain.stdout
    assert "main ['20']" in guarded.stdout
    log = json.loads((tmp_path / "log.json").read_text())
    assert log["schema"] == 1 and log["status"] == "ok" and log["steps"] == 20
    assert log["events"] == [] and log["exit_code"] == 0
    assert len(log["history"]) == 20 and log["history"][0]["grad_norm"] > 0


NAN = """
    import torch, torch.nn as nn, torch.nn.functional as F
    torch.manual_seed(0)
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(8, 8)
            self.head = nn.Linear(8, 1)
        def forward(self, x):
            h = self.body(x)
            return self.head(torch.sqrt(h - h))      # sqrt(0): infinite derivative
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        opt.zero_grad()
        loss = model(torch.randn(16, 8)).pow(2).mean()
        loss.backward()
        opt.step()
        print("step", step)
"""


def test_nonfinite_exits_3_with_the_finding_and_json(tmp_path: Path, spawn: Spawn) -> None:
    _script(tmp_path, NAN)
    r = _ng(spawn, tmp_path, "--json", "out/log.json", "train.py")
    assert r.returncode == 3, r.stderr
    assert "SqrtBackward0" in r.stderr and "cause: unsafe-op" in r.stderr
    assert r.stdout == ""  # stopped before the first print: at step 0
    log = json.loads((tmp_path / "out" / "log.json").read_text())
    assert log["status"] == "nonfinite" and log["exit_code"] == 3
    (ev,) = log["events"]
    assert (ev["phase"], ev["grad_fn"], ev["module"], ev["cause"]) == ("backward", "SqrtBackward0", "", "unsafe-op")
    assert ev["source"] == "train.py:11" and ev["step"] == 0
    for key in ("op", "dtype", "shape", "nan", "posinf", "neginf", "confidence", "evidence", "fixes"):
        assert key in ev


def test_policy_skip_keeps_the_run_going(tmp_path: Path, spawn: Spawn) -> None:
    _script(tmp_path, NAN)
    r = _ng(spawn, tmp_path, "--policy", "skip", "--json", "log.json", "train.py")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("step") == 5
    log = json.loads((tmp_path / "log.json").read_text())
    # every step failed: there is nothing to judge a recovery by, and it is not called one
    assert log["status"] == "unjudged" and len(log["recoveries"]) == 5
    # what the policy did is said at the end, not only in the log file
    assert "the run finished after 5 steps; it met non-finite values at 5 steps (policy skip)" in r.stderr
    assert "steps 0–4: unsafe-op → skip (×5)" in r.stderr
    assert "in all: 0 rollbacks, 0 batches dropped, 5 skipped" in r.stderr


def test_policy_recover_says_why_it_stopped_on_a_cause_with_no_blind_fix(
        tmp_path: Path, spawn: Spawn) -> None:
    _script(tmp_path, NAN)  # sqrt(0) in backward: unsafe-op
    r = _ng(spawn, tmp_path, "--policy", "recover", "--json", "log.json", "train.py")
    assert r.returncode == 3, r.stderr
    note = "policy 'recover' stopped here: unsafe-op has no blind fix"
    assert f"nanguard: {note}" in r.stderr
    log = json.loads((tmp_path / "log.json").read_text())
    assert any(n.startswith(note) for n in log["notes"])


def test_policy_recover_says_what_it_changed(tmp_path: Path, spawn: Spawn) -> None:
    _script(tmp_path, """
        import torch, torch.nn as nn, torch.nn.functional as F
        torch.manual_seed(0)
        torch.set_num_threads(1)
        model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
        opt = torch.optim.SGD(model.parameters(), lr=10.0)  # far too high
        x, y = torch.randn(64, 8), torch.randn(64, 1)
        for step in range(30):
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
    """)
    r = _ng(spawn, tmp_path, "--policy", "recover", "train.py")
    assert r.returncode == 0, r.stderr
    assert "(policy recover):" in r.stderr and "learning-rate-too-high → rollback" in r.stderr
    assert "the learning rate is now ×" in r.stderr and "the run log: nanguard run --json PATH" in r.stderr


def test_other_exceptions_keep_their_traceback_and_status(tmp_path: Path, spawn: Spawn) -> None:
    _script(tmp_path, """
        import torch
        def helper():
            raise KeyError("no such column")
        helper()
    """)
    r = _ng(spawn, tmp_path, "--json", "log.json", "train.py")
    assert r.returncode == 1
    assert 'File "' in r.stderr and "train.py\", line 4, in helper" in r.stderr
    assert "KeyError: 'no such column'" in r.stderr
    assert "runpy" not in r.stderr
    assert json.loads((tmp_path / "log.json").read_text())["status"] == "error"


def test_sys_exit_status_is_kept(tmp_path: Path, spawn: Spawn) -> None:
    _script(tmp_path, "import sys, torch\nprint('bye')\nsys.exit(7)\n")
    r = _ng(spawn, tmp_path, "train.py")
    assert r.returncode == 7 and r.stdout == "bye\n"


def test_missing_script_and_syntax_error(tmp_path: Path, spawn: Spawn) -> None:
    r = _ng(spawn, tmp_path, "nope.py")
    assert r.returncode == 2 and "no such file: nope.py" in r.stderr
    _script(tmp_path, "def f(:\n  pass\n", "bad.py")
    r = _ng(spawn, tmp_path, "bad.py")
    assert r.returncode == 1 and "SyntaxError" in r.stderr


def test_crash_caused_by_nan_is_explained_first(tmp_path: Path, spawn: Spawn) -> None:
    _script(tmp_path, """
        import torch, torch.nn as nn
        torch.manual_seed(0)
        policy = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        with torch.no_grad():
            policy[2].bias[0] = float("nan")      # a corrupted weight
        probs = torch.softmax(policy(torch.randn(5, 4)), -1)
        action = torch.multinomial(probs, 1)      # dies of the NaN in its own way
    """)
    r = _ng(spawn, tmp_path, "--json", "log.json", "train.py")
    assert r.returncode == 3
    assert "RuntimeError" in r.stderr  # the script's own error is still shown
    assert "caused by a non-finite value" in r.stderr
    log = json.loads((tmp_path / "log.json").read_text())
    (ev,) = log["events"]
    assert ev["cause"] == "nonfinite-parameters" and "2.bias" in str(ev["details"])


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_json_is_written_on_ctrl_c(tmp_path: Path, spawn: Spawn) -> None:
    _script(tmp_path, """
        import time, torch
        print("ready", flush=True)
        while True:
            time.sleep(0.05)
    """)
    # a shell without job control starts background jobs with SIGINT ignored, and a child inherits
    # that; give the child the default a terminal's Ctrl-C would meet
    p = spawn.popen("-m", "nanguard", "run", "--json", "log.json", "train.py",
                    cwd=tmp_path, env=ENV, preexec_fn=_default_sigint)
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "ready"
    time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    # read both pipes while waiting: an unread pipe that fills up would block the child forever
    _, err = p.communicate(timeout=600)
    assert p.returncode == 130, err[-3000:]
    assert json.loads((tmp_path / "log.json").read_text())["status"] == "interrupted"


def test_dataloader_workers_and_torch_compile(tmp_path: Path, spawn: Spawn) -> None:
    _script(tmp_path, """
        import torch, torch.nn as nn, torch.nn.functional as F
        from torch.utils.data import DataLoader, TensorDataset
        def main():
            torch.manual_seed(0)
            x, y = torch.randn(128, 8), torch.randn(128, 1)
            x[70, 3] = float("nan")
            dl = DataLoader(TensorDataset(x, y), batch_size=32, num_workers=2)
            model = torch.compile(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            for xb, yb in dl:
                opt.zero_grad(); F.mse_loss(model(xb), yb).backward(); opt.step()
        if __name__ == "__main__":
            main()
    """)
    r = _ng(spawn, tmp_path, "--json", "log.json", "train.py", timeout=600)
    assert r.returncode == 3, r.stderr[-2000:]
    (ev,) = json.loads((tmp_path / "log.json").read_text())["events"]
    assert ev["phase"] == "data" and ev["step"] == 2
    assert ev["details"]["samples"] == [{"index": 6, "kind": "NaN", "features": [3], "dataset_index": 70}]
    assert "torch.compile" in ev["details"]["note"]


def test_python_dash_m_and_env_policy(tmp_path: Path, spawn: Spawn) -> None:
    _script(tmp_path, NAN)
    r = spawn.nanguard("run", "train.py", cwd=tmp_path, env={**ENV, "NANGUARD_POLICY": "skip"},
                       timeout=600)
    assert r.returncode == 0
    r = spawn.nanguard("run", "train.py", cwd=tmp_path, env={**ENV, "NANGUARD_POLICY": "bogus"},
                       timeout=600)
    assert r.returncode == 2 and "NANGUARD_POLICY='bogus'" in r.stderr


def test_trace_names_the_op_in_a_custom_function_backward_before_the_guard_fires(
        tmp_path: Path, spawn: Spawn) -> None:
    # no optimizer: backward() is the step marker, and the guard's own check runs after it too
    _script(tmp_path, """
        import torch, torch.nn as nn
        class Inv(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                out = torch.relu(x)
                ctx.save_for_backward(out)
                return out
            @staticmethod
            def backward(ctx, g):
                (out,) = ctx.saved_tensors
                return g / out
        class Act(nn.Module):
            def forward(self, x):
                return Inv.apply(x)
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), Act(), nn.Linear(8, 1))
        model(torch.randn(16, 4)).sum().backward()
    """)
    r = _ng(spawn, tmp_path, "--trace", "--json", "log.json", "train.py")
    assert r.returncode == 3, r.stderr
    (ev,) = json.loads((tmp_path / "log.json").read_text())["events"]
    assert (ev["op"], ev["phase"], ev["module"], ev["grad_fn"]) == ("aten.div.Tensor", "backward", "1", "InvBackward")
    assert ev["source"] == "train.py:12" and ev["cause"] == "unsafe-op" and ev["detected_by"] == "trace"
