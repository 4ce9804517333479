"""nanguard's dispatch modes load ``torch._dynamo`` only where the script does
(``nanguard.torch._light_mode``): no 1–4 s import and no wrapper per op on a script that never
compiles, and the wrapper PyTorch would have put in place as soon as one does."""

from __future__ import annotations

import importlib
import os
import textwrap
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

import nanguard
from _spawn import Spawn
from nanguard.torch import LocateOptions, _light_mode, _recorder
from nanguard.torch._collectives import NoCollectives

_ENV_KEYS = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _wrapped(cls: type) -> bool:
    """Is ``cls``'s own ``__torch_dispatch__`` PyTorch's dynamo-disabling wrapper?"""
    return hasattr(cls.__dict__["__torch_dispatch__"], "__wrapped__")


def _nothing_compiled(monkeypatch: pytest.MonkeyPatch, value: bool = False) -> None:
    monkeypatch.setattr(_light_mode, "compiled", lambda: value)


def test_twin_once_something_was_compiled_or_nothing_watches(monkeypatch: pytest.MonkeyPatch) -> None:
    _nothing_compiled(monkeypatch)
    monkeypatch.setattr(_light_mode, "_watchers", 1)  # as while a step recorder is registered
    light = NoCollectives()
    with light:
        assert type(light) is NoCollectives and not _wrapped(NoCollectives)
    importlib.import_module("torch._dynamo")
    _nothing_compiled(monkeypatch, True)
    compiled = NoCollectives()
    with compiled:  # it still dispatches as its class does
        assert type(compiled) is not NoCollectives and _wrapped(type(compiled))
        assert torch.ones(2).add(1).tolist() == [2.0, 2.0]
    _nothing_compiled(monkeypatch)
    monkeypatch.setattr(_light_mode, "_watchers", 0)
    unwatched = NoCollectives()
    with unwatched:
        assert type(unwatched) is type(compiled)  # one twin per class


def test_a_locator_watches_for_compile_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """``nanguard.locate`` with no guard: light until the block compiles something."""
    _nothing_compiled(monkeypatch)
    assert _light_mode._watchers == 0
    with nanguard.locate():
        mode = _get_current_dispatch_mode()
        assert not mode._under_dynamo and _light_mode._watchers == 1
        torch.compile(torch.nn.Linear(2, 2), backend="eager")
        assert mode._under_dynamo
    assert _light_mode._watchers == 0 and "compile" not in [p.name for p in _light_mode._COMPILE._patches]


def test_compiled_reads_dynamo_s_contexts() -> None:
    importlib.import_module("torch._dynamo")
    torch.compile(torch.nn.Linear(2, 2), backend="eager")  # a compiled context is made
    assert _light_mode.compiled()


def test_tape_pushed_before_compile_is_swapped_for_its_twin(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tape on the stack when ``torch.compile`` is called is popped and pushed again as the
    wrapped twin; the compiled function's NaN is still found at its op."""
    _nothing_compiled(monkeypatch)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 3)
    with nanguard.attach(model, opt) as guard:
        rec = guard.recorder
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        x.add(0)  # an op outside modules: the tape is on, as its light class
        assert rec.tape_is_on and type(rec._tape) is _recorder._Tape and _light_mode._watchers == 1
        _nothing_compiled(monkeypatch, True)

        def loss_fn(out: torch.Tensor) -> torch.Tensor:
            return torch.log(out.pow(2).mean() * 0)

        f = torch.compile(loss_fn, backend="eager")
        assert rec.tape_is_on and rec._tape._under_dynamo and _get_current_dispatch_mode() is rec._tape
        opt.zero_grad()
        with pytest.raises(nanguard.NonFiniteError) as e:
            f(model(x)).backward()
            opt.step()
    assert e.value.finding.op == "aten.log.default" and e.value.finding.phase == "forward"


def test_a_run_that_never_compiles_never_loads_dynamo(tmp_path: Path, spawn: Spawn) -> None:
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import sys, torch
        torch.manual_seed(0)
        x, y = torch.randn(50, 3), torch.randn(50)
        w = torch.zeros(3, requires_grad=True)
        for step in range(30):
            loss = ((x @ w - y) ** 2).mean()
            loss.backward()
            with torch.no_grad():
                w -= 0.1 * w.grad
                w.grad.zero_()
        print("dynamo loaded:", "torch._dynamo" in sys.modules)
    """))
    (tmp_path / "opt.py").write_text(textwrap.dedent("""
        import torch
        from nanguard.torch import _light_mode
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.Adam(model.parameters())  # loads dynamo for its own disable wrapper
        for step in range(5):
            opt.zero_grad(); model(torch.randn(4, 3)).pow(2).mean().backward(); opt.step()
        print("compiled:", _light_mode.compiled())
    """))
    r = spawn.nanguard("run", "train.py", cwd=tmp_path, env={**os.environ, **_ENV_KEYS})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "dynamo loaded: False" in r.stdout
    r = spawn.nanguard("run", "opt.py", cwd=tmp_path, env={**os.environ, **_ENV_KEYS})
    assert r.returncode == 0 and "compiled: False" in r.stdout, r.stderr[-2000:]


class _LogHead(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x * 0)  # the line


@pytest.mark.parametrize("deferred", [False, True])
@pytest.mark.parametrize("was_compiled", [False, True])
def test_source_line_the_same_light_or_twin(monkeypatch: pytest.MonkeyPatch, was_compiled: bool,
                                            deferred: bool) -> None:
    """The twin's wrapper adds frames between the op and the mode: the line inside the module's
    ``forward`` is found either way, not its caller's."""
    _nothing_compiled(monkeypatch, was_compiled)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), _LogHead())
    opts = LocateOptions(deferred=deferred)
    with pytest.raises(nanguard.NonFiniteError) as e, nanguard.locate(model, options=opts):
        assert _get_current_dispatch_mode()._under_dynamo is was_compiled
        model(torch.ones(3, 2)).sum().backward()
    assert e.value.finding.op == "aten.log.default" and e.value.finding.module == "1"
    assert e.value.finding.source_code == "return torch.log(x * 0)  # the line"


def test_compiled_stays_true_after_a_dynamo_reset() -> None:
    """``torch._dynamo.reset()`` empties dynamo's table of compiled contexts; what was compiled
    before it can still run (and compile again), so the modes stay wrapped."""
    dynamo = importlib.import_module("torch._dynamo")
    f = torch.compile(lambda t: t + 1, backend="eager")
    assert _light_mode.compiled()
    dynamo.reset()
    assert _light_mode.compiled()
    assert f(torch.ones(1)).item() == 2.0
