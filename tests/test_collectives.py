"""A replay never issues a collective: on one rank it would wait on ranks that are not replaying.

In process, a gloo group of one: a model whose forward all-reduces (as a tensor-parallel layer
does) meets log(0) after it. The replay stops before the all-reduce and says so; the finding is
the watch's, with the op left unnamed rather than a job left hanging."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import nanguard
from nanguard import NonFiniteError
from nanguard.core.finding import Finding
from nanguard.torch._collectives import CollectiveInReplay, NoCollectives, fsdp_modules


@pytest.fixture
def group(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


class Reduced(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        dist.all_reduce(h)  # a tensor-parallel layer's sum of partial outputs
        return h * torch.log(scale)


def _fails_at_step_2(fault: Callable[[Reduced, torch.Tensor], None]) -> Finding:
    """Four steps of ``Reduced`` under ``attach``, ``fault(model, scale)`` before step 2's forward."""
    torch.manual_seed(0)
    model = Reduced()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(NonFiniteError) as info, nanguard.attach(model, opt):
        for step in range(4):
            x, scale = torch.randn(8, 4), torch.rand(8, 1) + 1.0
            if step == 2:
                fault(model, scale)
            opt.zero_grad()
            F.mse_loss(model(x, scale), torch.zeros(8, 1)).backward()
            opt.step()
    return info.value.finding


def test_the_mode_stops_a_collective_before_it_runs(group: None) -> None:
    t = torch.ones(3)
    with pytest.raises(CollectiveInReplay) as info, NoCollectives():
        dist.all_reduce(t)
    assert info.value.op.startswith("c10d.allreduce")
    with NoCollectives():
        assert float((t * 2).sum()) == 6.0  # everything else runs


@pytest.mark.filterwarnings("ignore:c10d::allreduce_")  # torch's own: all_reduce has no autograd kernel
def test_a_replay_that_meets_a_collective_stops_and_says_so(group: None) -> None:
    def log_of_zero(_: Reduced, scale: torch.Tensor) -> None:
        scale[3, 0] = 0.0

    f = _fails_at_step_2(log_of_zero)
    assert f.step == 2 and f.detected_by != "replay"
    assert "stopped before `c10d.allreduce_.default`, a collective" in f.details["note"], f.details


def test_fsdp_modules_are_listed_once_in_order() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    assert fsdp_modules([model, None, model]) == []  # no FSDP2 module: nothing gathered


@pytest.mark.filterwarnings("ignore:c10d::allreduce_")
def test_weights_the_script_wrote_non_finite_between_steps_are_named_with_its_line(group: None) -> None:
    """A tensor-parallel forward (an all-reduce the replay may not run) on a weight the script
    set to inf between steps: the finding is the weight and the script's line — it was blamed on
    the previous update (``SGD.step`` at step 1), which had left the weights finite."""
    def corrupt_slice(model: Reduced, _: torch.Tensor) -> None:
        with torch.no_grad():
            model.fc.weight[0, 1] = float("inf")

    f = _fails_at_step_2(corrupt_slice)
    assert (f.step, f.details.get("origin"), f.details.get("parameters")) == (2, "parameter", ["fc.weight"]), f
    assert f.details["note"].startswith("the script wrote into these weights at tests/test_collectives.py:"), f
