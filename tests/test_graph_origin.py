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
