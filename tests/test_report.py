"""The HTML run report, the `nanguard report` command, TensorBoard output and the live status."""

from __future__ import annotations

import io
import json
import os
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("matplotlib")

from _spawn import Spawn
from nanguard.cli import main as cli_main
from nanguard.core.history import History, StepRecord
from nanguard.core.report_html import render_report, write_report
from nanguard.core.runlog import RunLog
from nanguard.integrations.live import LiveStatus

ROOT = Path(__file__).resolve().parents[1]


def _history(n: int = 30, bad: int | None = 20) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        rec: dict[str, Any] = {"step": i, "loss": 2.0 / (i + 1), "grad_norm": 1.0 + i,
                               "param_norm": 10.0, "lr": 0.1, "finite": True}
        if i == bad:
            rec.update(loss="nan", grad_norm="inf", finite=False, skipped=True, event="rollback")
        if i >= n - 5:
            rec["layer_grad_norms"] = {"enc.<b>fc</b>.weight": 0.5 * i, "$x$.bias": 0.1 * i,
                                       "_private.weight": 0.2}
        out.append(rec)
    return out


def _doc(**kw: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema": 1, "nanguard": "0.1.0", "status": "recovered", "steps": 30,
        "script": "train<script>.py", "argv": ["--lr", "4"], "exit_code": 0, "framework": "torch",
        "duration_s": 1.5,
        "events": [{
            "step": 20, "phase": "forward", "op": "aten.log.default", "grad_fn": None,
            "module": "encoder.<script>alert(1)</script>", "module_type": "Linear",
            "source": "train.py:42", "source_code": "y = torch.log(x & 1)  # <b>",
            "dtype": "float32", "shape": [4, 4], "nan": 0, "posinf": 0, "neginf": 3,
            "reached": "loss", "cause": "unsafe-op", "confidence": 0.9,
            "summary": "log of 0 <here>", "evidence": ["17 zeros & more"],
            "fixes": ["y = torch.log(x.clamp_min(1e-12))  # <fix>"],
            "inputs": [{"name": "self", "dtype": "float32", "shape": [4, 4], "numel": 16,
                        "zeros": 3}],
            "scalars": {}, "details": {},
        }],
        "recoveries": [{"step": 20, "action": "rollback", "reason": "lr", "description":
                        "rollback + learning rate ×0.5", "cause": "unsafe-op", "restored_step": 10},
                       {"step": 25, "action": "skip", "reason": "policy 'skip'",
                        "description": "skip"}],
        "error": None, "notes": ["a note <i>"], "history": _history(),
    }
    doc.update(kw)
    return doc


def _assert_offline(html: str) -> None:
    """No fetch of anything: no src/href to a URL, no CSS import or url(), no external font."""
    assert not re.search(r"<script[^>]*\bsrc\s*=", html)
    assert not re.search(r"<link\b", html)
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", html)
    assert "@import" not in html
    assert not re.search(r"url\(\s*[\"']?(https?:)?//", html)


def test_report_has_finding_plots_and_marks() -> None:
    html = render_report(_doc())
    for pid in ("plot-loss", "plot-grad-norm", "plot-layer-grad-norms", "plot-lr", "plot-ratio"):
        assert f"id='{pid}'" in html
    assert html.count("<svg") == 5
    assert "aten.log.default" in html and "unsafe-op" in html and "train.py:42" in html
    assert "first non-finite (step 20)" in html  # the mark's legend, as SVG text
    assert "rollback (to step 10)" in html
    assert "skipped step" in html
    assert "rollback + learning rate ×0.5" in html
    assert "class='copy'" in html and "torch.log(x.clamp_min(1e-12))" in html
    _assert_offline(html)


def test_everything_from_the_run_is_escaped() -> None:
    html = render_report(_doc())
    assert "<script>alert(1)</script>" not in html
    assert "encoder.&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "x &amp; 1" in html and "&lt;fix&gt;" in html and "&lt;here&gt;" in html
    assert "train&lt;script&gt;.py" in html and "a note &lt;i&gt;" in html
    # layer names reach matplotlib: escaped as SVG text, `$` kept literal (no mathtext)
    assert "enc.&lt;b&gt;fc&lt;/b&gt;.weight" in html and "<b>fc</b>" not in html
    assert "$x$.bias" in html
    assert "_private.weight" in html  # a leading underscore does not hide a legend entry
    # the only script is the inline copy-button handler
    assert html.count("<script") == 1


def test_healthy_and_empty_runs() -> None:
    healthy = render_report(_doc(status="ok", events=[], recoveries=[],
                                 history=_history(bad=None)))
    assert "30 steps, no non-finite value." in healthy and ">healthy<" in healthy
    assert "first non-finite" not in healthy
    empty = render_report(_doc(status="error", events=[], recoveries=[], history=[],
                               error="RuntimeError: boom <x>"))
    assert "No steps were recorded." in empty and "boom &lt;x&gt;" in empty
    assert "<svg" not in empty


def _step0_row() -> dict[str, Any]:
    """The one history row of a run whose first step was already non-finite (as the torch
    adapter records it)."""
    return {"step": 0, "loss": "nan", "grad_norm": "inf", "param_norm": 1.9, "lr": 0.1,
            "finite": False, "skipped": True, "event": "nonfinite",
            "layer_grad_norms": {"fc.weight": "nan", "fc.bias": "nan"}}


def test_a_failure_at_step_0_draws_no_empty_plots_and_says_why() -> None:
    event = {**_doc()["events"][0], "step": 0}
    step0 = _doc(status="nonfinite", steps=1, recoveries=[], events=[event], history=[_step0_row()])
    html = render_report(step0)
    assert "<svg" not in html and "id='plot-" not in html and "Marks:" not in html
    assert ("No plots: the run stopped at step 0, before any healthy step was recorded."
            in html)
    # the data check can stop a run before its first step is recorded at all
    assert "before any healthy step was recorded" in render_report({**step0, "history": []})
    # one healthy step is a history: the plots stay, the non-finite step marked
    healthy = {**_step0_row(), "loss": 2.0, "grad_norm": 1.0, "finite": True, "skipped": False,
               "event": None, "layer_grad_norms": {"fc.weight": 0.5, "fc.bias": 0.1}}
    two = render_report({**step0, "events": [{**event, "step": 1}],
                         "history": [healthy, {**_step0_row(), "step": 1}]})
    assert "No plots" not in two and "id='plot-loss'" in two and two.count("<svg") >= 3


def test_a_report_without_plots_needs_no_matplotlib(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    step0 = _doc(status="nonfinite", recoveries=[], history=[_step0_row()])
    write_report(step0, str(tmp_path / "step0.html"))
    write_report(_doc(), str(tmp_path / "asked.html"), no_plots="No plots: not now.")
    assert "<p id='no-plots'>No plots: not now.</p>" in (tmp_path / "asked.html").read_text()
    assert "before any healthy step" in (tmp_path / "step0.html").read_text()
    with pytest.raises(ImportError, match="nanguard\\[report\\]"):
        write_report(_doc(), str(tmp_path / "plots.html"))


def test_write_report_from_a_runlog_object_of_the_seed_demo(tmp_path: Path) -> None:
    import nanguard
    from nanguard.demos import seed_torch

    with pytest.raises(nanguard.NonFiniteError) as info:
        seed_torch.train(seed_torch.LR)
    err = info.value
    hist = History()
    for i, (loss, g) in enumerate([(9.96, 5.4), (1.8e4, 1.3e4), (9.2e5, 1.7e6), (2e30, 8e26)]):
        hist.append(StepRecord(step=i, loss=loss, grad_norm=g, param_norm=22.5 * 10**i, lr=4.0))
    log = RunLog(status="nonfinite", steps=4, script="seed.py", events=[(err.finding, err.diagnosis)],
                 history=hist, exit_code=3)
    (tmp_path / "sub").mkdir()
    out = tmp_path / "sub" / "report.html"
    write_report(log, str(out))
    html = out.read_text()
    assert "aten.addmm.default" in html and "fc2 (Linear)" in html
    assert "learning-rate-too-high" in html and "stopped on a non-finite value" in html
    assert oct(out.stat().st_mode & 0o777) != oct(0o600)  # as any file the user writes


def test_report_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "run.json"
    src.write_text(json.dumps(_doc()))
    assert cli_main(["report", str(src), "-o", str(tmp_path / "out.html")]) == 0
    assert "<svg" in (tmp_path / "out.html").read_text()
    assert cli_main(["report", str(src)]) == 0  # default: next to the run log
    assert (tmp_path / "run.html").exists()
    assert cli_main(["report", str(tmp_path / "missing.json")]) == 2
    (tmp_path / "bad.json").write_text(json.dumps({"schema": 99}))
    assert cli_main(["report", str(tmp_path / "bad.json")]) == 2
    assert "schema" in capsys.readouterr().err


def test_nanguard_run_writes_report_json_and_tensorboard(tmp_path: Path, spawn: Spawn) -> None:
    pytest.importorskip("tensorboard")
    script = tmp_path / "seed.py"
    script.write_text("from nanguard.demos.seed_torch import train\ntrain(4.0)\n")
    report, runlog, tb = tmp_path / "r.html", tmp_path / "r.json", tmp_path / "tb"
    proc = spawn.nanguard(
        "run", "--report", str(report), "--json", str(runlog), "--tensorboard", str(tb), str(script),
        timeout=600, cwd=ROOT,
    )
    assert proc.returncode == 3, proc.stderr
    html = report.read_text()
    assert "aten.addmm.default" in html and html.count("<svg") >= 4
    assert json.loads(runlog.read_text())["status"] == "nonfinite"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(tb))
    ea.Reload()
    tags = ea.Tags()
    assert {"nanguard/loss", "nanguard/grad_norm", "nanguard/lr"} <= set(tags["scalars"])
    steps = [e.step for e in ea.Scalars("nanguard/loss")]
    # step 0 may be written twice (redone); step 4, the one that raised, is recorded too
    assert sorted(set(steps)) == [0, 1, 2, 3, 4]
    assert "nanguard/finding/text_summary" in tags["tensors"]


def test_report_without_matplotlib_names_the_extra(tmp_path: Path, spawn: Spawn) -> None:
    code = textwrap.dedent(f"""
        import sys
        sys.modules["matplotlib"] = None          # as if it were not installed
        import nanguard                           # still imports
        from nanguard.core.report_html import write_report
        try:
            write_report({{"status": "ok", "history": [{{"step": 0, "loss": 1.0}}]}},
                         {str(tmp_path / 'x.html')!r})
        except ImportError as exc:
            print("ERR", exc)
    """)
    out = spawn.python("-c", code, timeout=600)
    assert "ERR" in out.stdout and "nanguard[report]" in out.stdout, out.stderr


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


class _FakeGuard:
    def __init__(self) -> None:
        self.step = 1234
        self.history = History()
        self.history.append(StepRecord(step=1233, loss=0.5312))
        self.recoveries = [{"action": "rollback"}, {"action": "skip"}, {"action": "drop_batch"}]
        self.on_step_end: list[Any] = []


def test_live_status_only_on_a_terminal() -> None:
    assert not LiveStatus(io.StringIO()).enabled
    assert LiveStatus.line(_FakeGuard(), 12.3) == (
        "nanguard ▸ step 1,234 · loss 0.5312 · 2 skipped · 1 rollback · 12 s"
    )
    tty = _Tty()
    live = LiveStatus(tty, delay=0.0, interval=0.0)
    assert live.enabled
    g = _FakeGuard()

    class _Session:
        guard = g

    live.watch(_Session())
    for fn in g.on_step_end:
        fn()
    live.close()
    assert "step 1,234" in tty.getvalue()


def test_live_status_can_be_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NANGUARD_LIVE", "0")
    assert not LiveStatus(_Tty()).enabled


def test_report_file_is_written_atomically(tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    write_report(_doc(), str(out))
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".nanguard-")]
    assert out.read_text().startswith("<!DOCTYPE html>")


# --- edges: bad run logs, output paths, later events, odd names, narrow terminals ---------------


def test_report_command_refuses_what_is_not_a_run_log_with_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = {
        "list.json": ("[1, 2]", "holds a JSON list"),
        "types.json": (json.dumps({"schema": 1, "steps": "3", "events": "x"}),
                       "run log.steps should be an integer"),
        "event.json": (json.dumps({**_doc(), "events": [{**_doc()["events"][0], "step": "20"}]}),
                       "events[0].step should be an integer or null"),
    }
    for name, (text, says) in cases.items():
        (tmp_path / name).write_text(text)
        assert cli_main(["report", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    (tmp_path / "dir.json").mkdir()
    assert cli_main(["report", str(tmp_path / "dir.json")]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_report_command_never_creates_folders_nor_overwrites_by_default(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "run.json"
    src.write_text(json.dumps(_doc()))
    missing = tmp_path / "nonexistent_dir"
    assert cli_main(["report", str(src), "-o", str(missing / "r.html")]) == 2
    assert "does not exist" in capsys.readouterr().err and not missing.exists()
    (tmp_path / "run.html").write_text("the --report of the run")
    assert cli_main(["report", str(src)]) == 2  # the default name would overwrite it
    assert "already exists" in capsys.readouterr().err
    assert (tmp_path / "run.html").read_text() == "the --report of the run"
    assert cli_main(["report", str(src), "-o", str(tmp_path / "run.html")]) == 0  # asked for
    assert "<svg" in (tmp_path / "run.html").read_text()
    with pytest.raises(FileNotFoundError):
        write_report(_doc(), str(tmp_path / "missing" / "r.html"))


def test_later_events_are_not_the_first_and_outside_a_module_says_so() -> None:
    first = _doc()["events"][0]
    later = {**first, "step": 25, "op": "aten.div.Tensor", "module": None, "module_type": None}
    html = render_report(_doc(events=[first, later]))
    assert "the first non-finite value was made in the forward pass at step 20" in html
    assert "a non-finite value was made in the forward pass at step 25" in html
    assert "the first non-finite value was made in the forward pass at step 25" not in html
    assert "<code>aten.div.Tensor</code> (outside any module)" in html
    assert "in <code></code>" not in html and "in <code>None</code>" not in html


def test_a_layer_name_with_dollar_and_backslash_is_drawn_as_written() -> None:
    hist = _history()
    for rec in hist[-5:]:
        rec["layer_grad_norms"] = {r"$\alpha.weight": 1.0, "plain.weight": 2.0}
    html = render_report(_doc(history=hist))
    assert r"$\alpha.weight" in html
    assert r"\\alpha" not in html


def test_the_fix_wraps_on_a_narrow_terminal() -> None:
    from rich.console import Console

    from nanguard.core import Cause, Diagnosis, Finding
    from nanguard.core.render import finding_panel

    fix = ("optimizer = torch.optim.SGD(model.parameters(), lr=1)  # was 4: the update was "
           "as large as the weights")
    f = Finding(phase="forward", op="aten.addmm.default", module="fc2", module_type="Linear",
                step=4, dtype="float32", shape=(64, 64), posinf=58)
    d = Diagnosis(Cause.LEARNING_RATE_TOO_HIGH, 0.85, "updates too large", ["the weights grew"], [fix])
    buf = io.StringIO()
    Console(file=buf, width=60, color_system=None).print(finding_panel(f, d))
    out = buf.getvalue()
    assert max(len(line) for line in out.splitlines()) <= 60
    for word in fix.split():
        assert word in out, word  # wrapped, not cut off


def _events(path: Path) -> list[Any]:
    """The records of a TensorBoard event file (uint64 length, uint32 CRC, data, uint32 CRC)."""
    import struct

    from tensorboard.compat.proto import event_pb2

    data, out, pos = path.read_bytes(), [], 0
    while pos < len(data):
        (n,) = struct.unpack("<Q", data[pos : pos + 8])
        out.append(event_pb2.Event.FromString(data[pos + 12 : pos + 12 + n]))
        pos += 12 + n + 4
    return out


def test_tensorboard_logging_imports_no_tensorflow(tmp_path: Path, spawn: Spawn) -> None:
    pytest.importorskip("tensorboard")
    code = textwrap.dedent(f"""
        import sys
        from nanguard.core.history import StepRecord
        from nanguard.integrations.tensorboard import TensorBoardLogger
        tb = TensorBoardLogger({str(tmp_path / "tb")!r})
        for i in range(3):
            tb.log_step(StepRecord(step=i, loss=1.0 / (i + 1), grad_norm=2.0, lr=0.1))
        tb.writer.add_text("nanguard/finding", "log(0) in fc2", 2)
        tb.close()
        print("tensorflow" in sys.modules, "torch" in sys.modules)
    """)
    proc = spawn.python("-c", code, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False"]  # neither TensorFlow nor torch imported
    (path,) = (tmp_path / "tb").glob("events.out.tfevents.*")
    events = _events(path)
    assert events[0].file_version == "brain.Event:2"
    loss = [(e.step, e.summary.value[0].simple_value) for e in events
            if e.summary.value and e.summary.value[0].tag == "nanguard/loss"]
    assert loss == [(0, 1.0), (1, 0.5), (2, pytest.approx(1 / 3))]
    text = [e for e in events if e.summary.value and e.summary.value[0].tag.endswith("text_summary")]
    assert text[0].summary.value[0].tensor.string_val == [b"log(0) in fc2"]
    assert text[0].summary.value[0].metadata.plugin_data.plugin_name == "text"
