"""The origin of a non-finite loss read from its autograd graph before ``backward()`` (what a
lean rollout's step has instead of a replay): the op that made it from finite saved inputs, or
the tensor from outside the graph — the earliest when there are several."""

from __future__ import annotations

import torch

from nanguard.torch._graph_origin import graph_origin


def _w() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(5, requires_grad=True)


def test_a_log_of_zero_is_named_with_its_input() -> None:
    w = _w()
    loss = (torch.log(w.relu() * 0) * 2).sum()
    f = graph_origin([loss], step=7)
    assert f is not None
    assert (f.op, f.grad_fn, f.phase, f.step, f.detected_by) == ("aten.log", "LogBackward0", "forward", 7, "graph")
    assert f.neginf == 5 and f.inputs[0].zeros == 5


def test_an_exp_that_overflows_is_named_by_its_saved_result() -> None:
    w = _w()
    loss = torch.exp(w * 0 + 200.0).mean()
    f = graph_origin([loss], step=0)
    assert f is not None and (f.op, f.grad_fn, f.posinf) == ("aten.exp", "ExpBackward0", 5)


def test_a_division_by_a_zero_divisor_is_named() -> None:
    w = _w()
    loss = (w / (w - w)).sum()
    f = graph_origin([loss], step=0)
    assert f is not None and (f.op, f.grad_fn) == ("aten.div", "DivBackward0")
    assert any(s.name == "other" and s.zeros == 5 for s in f.inputs)


def test_a_nan_built_without_grad_is_the_origin_not_the_ops_it_passed() -> None:
    w = _w()
    returns = torch.tensor([1.0, float("nan"), 2.0, 3.0, 4.0])
    loss = torch.exp(w * returns).sum()  # exp's result is NaN too, but it was handed the NaN
    f = graph_origin([loss], step=0)
    assert f is not None
    assert (f.op, f.phase, f.nan, f.details["origin"]) == ("input", "data", 1, "unrecorded")


def test_the_earliest_of_two_origins_is_taken() -> None:
    w = _w()
    first = torch.log(w * 0)       # made first
    second = torch.sqrt(w.abs() * -1 - 1)
    f = graph_origin([(second + first).sum()], step=0)
    assert f is not None and f.grad_fn == "LogBackward0"


def test_a_finite_graph_shows_nothing() -> None:
    w = _w()
    assert graph_origin([(torch.log(w.abs() + 1) * 3).sum()], step=0) is None


SCRIPT = '''\
import torch
from nanguard.torch._graph_origin import graph_origin

def update(w, rewards):
    R, returns = 0.0, []
    for r in reversed(rewards):
        R = r + 0.99 * R
        returns.insert(0, R)
    returns = torch.tensor(returns)
    returns = (returns - returns.mean()) / (returns.std() + 1e-8)
    loss = -(w[:3] * returns).sum()
    return graph_origin([loss], step=6)
'''


def test_a_tensor_built_from_python_numbers_is_named_by_its_variable_and_lines(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Returns that overflowed as Python floats (1e308 + 0.99 * 1e308 = inf) became a tensor at
    line 9 and NaN at line 10: the finding names the script's variable and both lines, read
    from the source when the finding is made."""
    path = tmp_path / "rl.py"
    path.write_text(SCRIPT)
    ns: dict[str, object] = {}
    exec(compile(SCRIPT, str(path), "exec"), ns)
    f = ns["update"](_w(), [1e308, 1e308, 1e308])  # type: ignore[operator]
    assert f is not None and (f.phase, f.op, f.detected_by) == ("data", "input", "graph")
    assert f.source is not None and f.source.endswith("rl.py:10")
    assert f.source_code == "returns = (returns - returns.mean()) / (returns.std() + 1e-8)"
    assert f.details["script_variable"] == "returns"
    assert f.details["note"].startswith("the script's `returns` holds it, last assigned at line 10 "
                                        "← line 9 (read from the source")
    assert "line 9 made it from Python numbers or an array (`returns = torch.tensor(returns)`)" \
        in f.details["note"]


def test_the_assignment_chain_stays_in_its_function(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from nanguard.core.source import assignment_chain

    path = tmp_path / "s.py"
    path.write_text("x = 1\ndef f():\n    x = 2\n    x += 1\n    y = x\n    return y\nx = x * 3\nz = x\n")
    assert assignment_chain(str(path), 5, "x") == [(4, "x += 1"), (3, "x = 2")]
    assert assignment_chain(str(path), 8, "x") == [(7, "x = x * 3"), (1, "x = 1")]
    assert assignment_chain(str(path), 8, "nope") == []
    assert assignment_chain(str(tmp_path / "missing.py"), 3, "x") == []
