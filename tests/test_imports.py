"""nanguard works for PyTorch users with no TensorFlow, and its core needs neither framework."""

from __future__ import annotations

import subprocess
import textwrap

from _spawn import Spawn


def _run(spawn: Spawn, code: str) -> subprocess.CompletedProcess[str]:
    return spawn.python("-c", textwrap.dedent(code), timeout=600)


def test_core_and_cli_import_without_any_framework(spawn: Spawn) -> None:
    r = _run(spawn, """
        import sys
        sys.modules["torch"] = None
        sys.modules["tensorflow"] = None
        sys.modules["keras"] = None
        import nanguard
        from nanguard.core import Finding, diagnose, Cause
        from nanguard.cli import build_parser
        build_parser()
        f = Finding(phase="forward", op="aten.log.default", inputs=[])
        print(diagnose(f).cause.value)
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() in {c.value for c in __import__("nanguard").Cause}


def test_torch_side_works_without_tensorflow(spawn: Spawn) -> None:
    r = _run(spawn, """
        import sys
        sys.modules["tensorflow"] = None
        sys.modules["keras"] = None
        import torch, nanguard
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with nanguard.attach(model, opt):
            model(torch.randn(4, 3)).sum().backward()
            opt.step()
        with nanguard.locate(model):
            model(torch.randn(4, 3)).sum().backward()
        print("ok")
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"
