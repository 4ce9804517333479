"""The public errors and entry points at their edges: a diagnosis on every `locate()` error, a
readable `str(err)`, and demos that say what to install."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

import nanguard
from _spawn import Spawn
from nanguard import Cause, GiveUpError, NonFiniteError
from nanguard.cli import main as cli_main

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}


def test_an_error_from_locate_has_a_diagnosis_and_starts_with_its_headline() -> None:
    torch = pytest.importorskip("torch")

    class LogLayer(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.log(x * 0.0)

    model = torch.nn.Sequential(torch.nn.Linear(3, 3), LogLayer())
    with pytest.raises(NonFiniteError) as info, nanguard.locate(model):
        model(torch.ones(2, 3)).sum().backward()
    err = info.value
    assert err.diagnosis is not None and err.diagnosis.cause is Cause.UNSAFE_OP
    assert err.finding.op == "aten.log.default"
    text = str(err)
    assert text.startswith("nanguard: the first non-finite value was made in the forward pass")
    assert "cause: unsafe-op" in text
    with pytest.raises(NonFiniteError) as again, nanguard.torch.locate(model):
        model(torch.ones(2, 3)).sum().backward()
    assert again.value.diagnosis is not None


def test_keras_locate_errors_have_a_diagnosis_too() -> None:
    tf = pytest.importorskip("tensorflow")
    pytest.importorskip("keras")
    import nanguard.keras

    v = tf.Variable([1.0, 2.0])
    with pytest.raises(NonFiniteError) as info, nanguard.keras.locate():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.math.log(v * 0.0))
        tape.gradient(loss, [v])
    assert info.value.diagnosis is not None and info.value.diagnosis.cause is Cause.UNSAFE_OP


def test_give_up_error_reads_from_its_first_line() -> None:
    f = nanguard.Finding(phase="data", op="input", step=12)
    err = GiveUpError(f, None, reason="10 consecutive steps had non-finite values",
                      attempts=["skip"] * 10)
    assert str(err).startswith("nanguard gave up: 10 consecutive steps")
    assert "\nnanguard: the first non-finite value was made in the input data" in str(err)


@pytest.mark.parametrize(("blocked", "args", "says"), [
    (("torch",), ["demo"], "pip install 'nanguard[torch]'"),
    (("tensorflow", "keras"), ["demo", "--framework", "keras"], "pip install 'nanguard[tf]'"),
])
def test_a_demo_without_its_framework_says_what_to_install(
        blocked: tuple[str, ...], args: list[str], says: str, spawn: Spawn) -> None:
    code = textwrap.dedent(f"""
        import sys
        for name in {blocked!r}:
            sys.modules[name] = None  # as with the base install
        from nanguard.cli import main
        sys.exit(main({args!r}))
    """)
    proc = spawn.python("-c", code, timeout=600, env=ENV)
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_bad_command_lines_get_the_run_commands_own_messages(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli_main(["run", "--bogus", "x.py"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "usage: nanguard run" in err
    assert "nanguard run: error: unrecognized arguments: --bogus" in err
    with pytest.raises(SystemExit):
        cli_main(["run"])
    err = capsys.readouterr().err
    assert "the script to run is missing" in err and "required: script, args" not in err
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__main__.py").write_text("")
    assert cli_main(["run", str(tmp_path / "pkg")]) == 2
    err = capsys.readouterr().err
    assert "is a directory, not a Python script" in err and "__main__.py" in err
    assert "no such file" not in err
