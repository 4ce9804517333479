"""`nanguard run` at its edges: outputs checked before the script starts and written one by one,
interrupts (a second Ctrl-C, SIGTERM), and the small ways it matches `python script.py`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from _spawn import HANG_S, Spawn
from nanguard._run_outputs import write_outputs
from nanguard.core.runlog import RunLog

ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
ROOT = Path(__file__).resolve().parents[1]

#: stops on a non-finite value at step 4 (the seed demo)
SEED = "from nanguard.demos.seed_torch import train\ntrain(4.0)\n"


def _write(tmp_path: Path, body: str, name: str = "train.py") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return p


def _ng(spawn: Spawn, tmp_path: Path, *args: str, env: dict[str, str] | None = None,
        code: str | None = None) -> subprocess.CompletedProcess[str]:
    """``nanguard run ARGS`` in a fresh process; ``code`` runs first (to simulate faults)."""
    cmd = ["-m", "nanguard", "run", *args]
    if code is not None:
        cmd = ["-c", code + "\nimport sys\nfrom nanguard.cli import main\n"
               f"sys.exit(main(['run', *{list(args)!r}]))"]
    return spawn.python(*cmd, cwd=tmp_path, timeout=HANG_S, env=env or ENV)


# --- outputs --------------------------------------------------------------------------------------


def test_outputs_are_checked_before_the_script_starts(tmp_path: Path, spawn: Spawn) -> None:
    _write(tmp_path, "open('ran', 'w').close()\n")
    (tmp_path / "afile").write_text("")
    for args, says in (
        (["--json", "afile/run.json", "--report", "ok.html"], "afile is a file, not a folder"),
        (["--report", "afile/sub/r.html"], "cannot create the folder"),
        (["--json", str(tmp_path)], "is a directory"),
    ):
        r = _ng(spawn, tmp_path, *args, "train.py")
        assert r.returncode == 2, r.stderr
        assert says in r.stderr and "nothing was run" in r.stderr and "Traceback" not in r.stderr
        assert not (tmp_path / "ran").exists()
    r = _ng(spawn, tmp_path, "--json", "runs/exp1/run.json", "train.py")  # a new folder: created first
    assert r.returncode == 0 and "created the folder" in r.stderr, r.stderr
    assert (tmp_path / "runs" / "exp1" / "run.json").exists() and (tmp_path / "ran").exists()
    (tmp_path / "ran").unlink()
    hide = "import sys\nsys.modules['matplotlib'] = None  # as if it were not installed"
    r = _ng(spawn, tmp_path, "--report", "r.html", "train.py", code=hide)
    assert r.returncode == 2 and "--report needs matplotlib" in r.stderr, r.stderr
    assert "nanguard[report]" in r.stderr and not (tmp_path / "ran").exists()


FULL_DISK = """
import errno
from nanguard.core.runlog import RunLog
def full(self, path):
    raise OSError(errno.ENOSPC, "No space left on device", path)
RunLog.write = full
"""


def test_a_failed_output_keeps_the_findings_status_and_the_other_output(
        tmp_path: Path, spawn: Spawn) -> None:
    _write(tmp_path, SEED)
    r = _ng(spawn, tmp_path, "--json", "run.json", "--report", "r.html", "train.py", code=FULL_DISK)
    assert r.returncode == 3, r.stderr  # the finding's status, not 1
    assert "could not write the run log to run.json: No space left on device" in r.stderr
    assert "Traceback" not in r.stderr and "the first non-finite value" in r.stderr
    assert "aten.addmm.default" in (tmp_path / "r.html").read_text()  # written all the same
    _write(tmp_path, "print('healthy')\n")
    r = _ng(spawn, tmp_path, "--json", "run.json", "--report", "r2.html", "train.py", code=FULL_DISK)
    assert r.returncode == 2 and (tmp_path / "r2.html").exists()  # a healthy run: 0 becomes 2


SECOND_CTRL_C = """
import os, signal
import nanguard.core.report_html as report_html
draw = report_html.write_report
def pressed_again(log, path, **kw):  # Ctrl-C again while the report is being drawn
    os.kill(os.getpid(), signal.SIGINT)
    return draw(log, path, **kw)
report_html.write_report = pressed_again
raise KeyboardInterrupt  # the first Ctrl-C
"""


def test_a_second_ctrl_c_does_not_lose_the_outputs(tmp_path: Path, spawn: Spawn) -> None:
    _write(tmp_path, SECOND_CTRL_C)
    r = _ng(spawn, tmp_path, "--json", "run.json", "--report", "r.html", "train.py")
    assert r.returncode == 130, r.stderr
    assert "finishing the run log and the report first" in r.stderr and "Traceback" not in r.stderr
    assert json.loads((tmp_path / "run.json").read_text())["status"] == "interrupted"
    assert "interrupted" in (tmp_path / "r.html").read_text()


def test_sigterm_exits_143_and_writes_the_run_log(tmp_path: Path, spawn: Spawn) -> None:
    _write(tmp_path, """
        import time, torch
        print("ready", flush=True)
        while True:
            time.sleep(0.05)
    """)
    p = spawn.popen("-m", "nanguard", "run", "--json", "log.json", "train.py",
                    cwd=tmp_path, env=ENV)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    time.sleep(0.2)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=HANG_S)  # reading both pipes: a full one would block the child
    assert p.returncode == 143, err[-3000:]  # 128 + SIGTERM, what schedulers expect (Ctrl-C: 130)
    assert "terminated (SIGTERM)" in err
    assert json.loads((tmp_path / "log.json").read_text())["status"] == "interrupted"


#: trains until it is stopped; "ready" once the history has healthy steps to plot
FOREVER = """
    import torch, torch.nn as nn, torch.nn.functional as F
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    step = 0
    while True:
        opt.zero_grad(); F.mse_loss(model(x), y).backward(); opt.step()
        step += 1
        if step == 20:
            print("ready", flush=True)
"""

#: says on stderr, as the process ends, whether matplotlib was ever imported
MPL_AT_EXIT = """
import atexit, sys
atexit.register(lambda: print("matplotlib imported:", "matplotlib" in sys.modules, file=sys.stderr))
"""


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt(spawn: Spawn, tmp_path: Path, sig: int, *args: str) -> tuple[int, str]:
    """``nanguard run ARGS train.py`` on :data:`FOREVER`, sent ``sig`` once it has trained."""
    _write(tmp_path, FOREVER)
    code = MPL_AT_EXIT + f"from nanguard.cli import main\nsys.exit(main(['run', *{list(args)!r}, 'train.py']))"
    # a shell without job control starts background jobs with SIGINT ignored, and a child
    # inherits that; give the child the default a terminal's Ctrl-C would meet
    p = spawn.popen("-c", code, cwd=tmp_path, env=ENV, preexec_fn=_default_sigint)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    p.send_signal(sig)
    _, err = p.communicate(timeout=HANG_S)  # reading both pipes: a full one would block the child
    return p.returncode, err


def test_ctrl_c_writes_the_run_log_and_a_report_without_plots(
        tmp_path: Path, spawn: Spawn) -> None:
    rc, err = _interrupt(spawn, tmp_path, signal.SIGINT, "--json", "run.json", "--report", "r.html")
    assert rc == 130, err[-3000:]
    log = json.loads((tmp_path / "run.json").read_text())
    assert log["status"] == "interrupted" and log["history"] and log["history"][0]["finite"]
    said = ("nanguard run: the report r.html has no plots: the run was interrupted, and drawing "
            "them takes seconds; draw them from the run log: nanguard report run.json -o r.html")
    assert said in err and "Traceback" not in err
    assert "matplotlib imported: False" in err  # the plots were not drawn, not even begun
    html = (tmp_path / "r.html").read_text()
    assert "<svg" not in html and ">interrupted<" in html
    assert "nanguard report run.json -o r.html" in html  # the page says how to get its plots
    assert not (tmp_path / "r.json").exists()  # --json was given: no second run log


def test_sigterm_with_only_a_report_keeps_the_run_log_beside_it(
        tmp_path: Path, spawn: Spawn) -> None:
    rc, err = _interrupt(spawn, tmp_path, signal.SIGTERM, "--report", "r.html")
    assert rc == 143, err[-3000:]
    assert "terminated (SIGTERM)" in err and "matplotlib imported: False" in err
    assert ("draw them from the run log written beside it: nanguard report r.json -o r.html"
            in err)
    assert json.loads((tmp_path / "r.json").read_text())["status"] == "interrupted"
    assert "<svg" not in (tmp_path / "r.html").read_text()


def _trained_log() -> RunLog:
    from nanguard.core.history import History, StepRecord

    hist = History()
    for i in range(5):
        hist.append(StepRecord(step=i, loss=1.0 / (i + 1), grad_norm=0.5, param_norm=3.0, lr=0.1))
    return RunLog(status="interrupted", steps=5, script="train.py", history=hist, exit_code=130)


def test_interrupted_the_run_log_comes_first_and_the_plots_are_left_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import nanguard.core.report_html as report_html

    runlog, report = str(tmp_path / "run.json"), str(tmp_path / "r.html")
    seen: list[str] = []

    def hurry() -> bool:  # asked after the run log is written, before the report
        seen.append(f"hurry asked, run log written: {os.path.exists(runlog)}")
        return True

    def no_drawing(log: Any, path: str, **kw: Any) -> None:
        seen.append(f"report: {kw.get('no_plots')}")

    monkeypatch.setattr(report_html, "write_report", no_drawing)
    written = write_outputs(_trained_log(), runlog, report, hurry=hurry)
    how = f"nanguard report {runlog} -o {report}"
    assert seen == ["hurry asked, run log written: True",
                    "report: No plots: the run was interrupted, and drawing them takes seconds; "
                    f"draw them from the run log: {how}"]
    assert written.failures == [] and written.notes == [
        f"the report {report} has no plots: the run was interrupted, and drawing them takes "
        f"seconds; draw them from the run log: {how}"]
    seen.clear()  # not interrupted: the report is drawn whole
    assert write_outputs(_trained_log(), runlog, report, hurry=lambda: False).notes == []
    assert seen == ["report: None"]


def test_interrupted_without_json_the_run_log_goes_beside_the_report(tmp_path: Path) -> None:
    report = str(tmp_path / "r.html")
    written = write_outputs(_trained_log(), None, report, hurry=lambda: True)
    assert json.loads((tmp_path / "r.json").read_text())["status"] == "interrupted"
    assert written.notes[0].endswith(
        f"draw them from the run log written beside it: nanguard report {tmp_path / 'r.json'} "
        f"-o {report}")
    assert "<svg" not in (tmp_path / "r.html").read_text()
    (tmp_path / "r.json").write_text("my own notes\n")  # a file of the user's: never replaced
    written = write_outputs(_trained_log(), None, report, hurry=lambda: True)
    assert (tmp_path / "r.json").read_text() == "my own notes\n"
    assert "is not a nanguard run log: it is kept" in written.notes[0]
    assert "no run log was kept to draw them from" in written.notes[1]
    assert written.failures == []


def test_the_run_log_has_the_reports_permissions(tmp_path: Path, spawn: Spawn) -> None:
    _write(tmp_path, "print('ok')\n")
    r = _ng(spawn, tmp_path, "--json", "run.json", "--report", "r.html", "train.py")
    assert r.returncode == 0, r.stderr
    modes = {p: (tmp_path / p).stat().st_mode & 0o777 for p in ("run.json", "r.html")}
    umask = os.umask(0o022)
    os.umask(umask)
    assert modes == {"run.json": 0o666 & ~umask, "r.html": 0o666 & ~umask}  # not mkstemp's 0600


# --- as `python script.py` ------------------------------------------------------------------------


def test_file_is_absolute_as_under_python(tmp_path: Path, spawn: Spawn) -> None:
    _write(tmp_path, """
        import os
        here = __file__
        os.chdir("/")
        print(os.path.isabs(here), os.path.exists(here))
    """)
    plain = spawn.python("train.py", cwd=tmp_path, timeout=HANG_S, env=ENV)
    guarded = _ng(spawn, tmp_path, "train.py")
    assert guarded.returncode == plain.returncode == 0, guarded.stderr
    assert guarded.stdout == plain.stdout == "True True\n"


# --- what the terminal says matches the run log -------------------------------------------------


def test_a_policy_that_gave_up_says_so_and_names_the_first_step(
        tmp_path: Path, spawn: Spawn) -> None:
    scenario = ROOT / "benchmarks" / "scenarios" / "lr_sgd_lr10_mlp.py"
    r = _ng(spawn, tmp_path, "--policy", "skip", "--json", "run.json", str(scenario))
    assert r.returncode == 3, r.stderr[-2000:]
    log = json.loads((tmp_path / "run.json").read_text())
    first, last = log["events"][0]["step"], log["events"][-1]["step"]
    skips = sum(1 for x in log["recoveries"] if x["action"] == "skip")
    assert first < last and skips == len(log["events"]) - 1
    err = r.stderr
    assert f"the first non-finite value was made in the forward pass at step {first}." in err
    assert f"at step {last}." not in err.split("nanguard gave up")[0]
    assert f"nanguard gave up at step {last} (policy skip)" in err
    assert f"skip (×{skips})" in err and f"{skips} skipped" in err
