"""Latent hazards found on all the rows a batch was cut from (torch._rows), and a raw parameter
walked toward 0 (torch.hazards.HazardMode._moving): warned by the watch at its sampled step 2,
long before the batch that holds the bad row, or the step that takes the parameter through 0."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import nanguard
from nanguard.core.early import EarlyWarning
from nanguard.torch._hazard_watch import SAMPLED_STEPS
from nanguard.torch._rows import RowTrace

Step = Callable[[nn.Module, int], torch.Tensor]


def _watch(model: nn.Module, step: Step, steps: int = 5, lr: float = 0.05,
           opt_cls: type = torch.optim.SGD) -> list[EarlyWarning]:
    """``steps`` optimizer steps under the watch; the warnings it gave."""
    opt = opt_cls(model.parameters(), lr=lr)
    guard = nanguard.attach(model, opt)
    try:
        with redirect_stderr(io.StringIO()):
            for i in range(steps):
                opt.zero_grad()
                step(model, i).backward()
                opt.step()
    finally:
        guard.detach()
    return list(guard.controller.early.warnings)


def _sales(zeros: list[int]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 4, generator=g)
    y = torch.randint(5, 50, (96,), generator=g).float()
    y[zeros] = 0.0  # days the store was closed
    while True:
        yield from DataLoader(TensorDataset(x, y), batch_size=8, shuffle=False)


@pytest.mark.parametrize("zeros", [[70, 90], []])
def test_a_division_by_targets_is_warned_when_rows_of_the_dataset_are_0(zeros: list[int]) -> None:
    torch.manual_seed(0)
    batches = _sales(zeros)

    def step(model: nn.Module, i: int) -> torch.Tensor:
        x, y = next(batches)
        return ((model(x).squeeze(-1) * 30 - y).abs() / y).mean()  # MAPE

    warnings = _watch(nn.Linear(4, 1), step)
    if not zeros:
        assert warnings == []
        return
    (w,) = warnings
    assert (w.kind, w.step) == ("latent-hazard", SAMPLED_STEPS[-1])
    assert w.message.startswith("`div` at tests/test_hazard_rows.py:")
    assert "division by data that is 0 on some rows: 2 of 96 rows of the float32[96] tensor" in w.message
    assert "hold a 0" in w.message and "clamp_min" in w.message


def _masked_mean_step(mask: torch.Tensor, per_row: bool) -> Step:
    ids = torch.randn(mask.shape[0], mask.shape[1], 3)

    def step(model: nn.Module, i: int) -> torch.Tensor:
        b = slice((i % 4) * 8, (i % 4) * 8 + 8)
        tok = model(ids[b]).squeeze(-1).pow(2)
        m = mask[b].float()
        if per_row:
            return ((tok * m).sum(1) / m.sum(1)).mean()
        return (tok * m).sum() / m.sum()

    return step


@pytest.mark.parametrize(("empty", "per_row", "warned"), [
    (8, False, True),  # a batch made only of empty lines is possible: the whole sum can be 0
    (1, False, False),  # one empty line: never a whole batch of them
    (1, True, True),  # a mean per line: one empty line divides by 0
])
def test_a_masked_mean_is_warned_when_enough_lines_of_the_mask_are_empty(
        empty: int, per_row: bool, warned: bool) -> None:
    torch.manual_seed(0)
    mask = torch.ones(32, 6, dtype=torch.long)
    mask[32 - empty:] = 0  # empty lines, in the last batch only
    warnings = _watch(nn.Linear(3, 1), _masked_mean_step(mask, per_row), steps=3)
    if not warned:
        assert warnings == []
        return
    (w,) = warnings
    said = f"{empty} of 32 rows of the int64[32, 6] tensor the batches are cut from sum to 0"
    assert w.kind == "latent-hazard" and said in w.message
    assert ("a batch made only of them" in w.message) is (not per_row)


class _Attention(nn.Module):
    def __init__(self, fill: float) -> None:
        super().__init__()
        self.embed, self.qk, self.fill = nn.Embedding(10, 8, padding_idx=0), nn.Linear(8, 8), fill

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        scores = self.qk(h) @ h.transpose(-2, -1)
        scores = scores.masked_fill((tokens == 0)[:, None, :], self.fill)  # padded keys
        return torch.softmax(scores, dim=-1) @ h


@pytest.mark.parametrize(("fill", "empty", "warned"), [
    (float("-inf"), True, True), (torch.finfo(torch.float32).min, True, False), (float("-inf"), False, False)])
def test_a_softmax_over_padded_keys_is_warned_when_a_document_is_empty(
        fill: float, empty: bool, warned: bool) -> None:
    torch.manual_seed(0)
    tokens = torch.randint(1, 10, (40, 5))
    tokens[:, 3:] = 0  # padding
    if empty:
        tokens[37] = 0  # an empty document, in a batch the first steps do not reach

    def step(model: nn.Module, i: int) -> torch.Tensor:
        return model(tokens[i * 8:i * 8 + 8]).pow(2).mean()

    warnings = _watch(_Attention(fill), step, steps=3)
    if not warned:
        assert warnings == []
        return
    (w,) = warnings
    assert w.message.startswith("`softmax` at tests/test_hazard_rows.py:")
    assert "1 of 40 rows of the int64[40, 5] tensor the batches are cut from hold a row masked" in w.message
    assert any("fewest unmasked positions in a row of the batches seen: 3" in e for e in w.evidence)


class _Gain(nn.Module):
    def __init__(self, start: float) -> None:
        super().__init__()
        self.lin, self.var = nn.Linear(4, 4), nn.Parameter(torch.full((4,), start))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * torch.sqrt(self.var)  # a learned variance, read as it is


@pytest.mark.parametrize(("lr", "warned"), [(0.02, True), (1e-4, False)])
def test_sqrt_of_a_raw_parameter_is_warned_when_steps_take_it_toward_0(lr: float, warned: bool) -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 4)

    def step(model: nn.Module, i: int) -> torch.Tensor:
        return (model(x) - 0.01 * x).pow(2).mean()  # the targets are small: the gain goes to 0

    warnings = _watch(_Gain(0.05), step, lr=lr)
    if not warned:
        assert warnings == []
        return
    (w,) = warnings
    assert (w.kind, w.step) == ("latent-hazard", SAMPLED_STEPS[-1])
    assert w.message.startswith("`sqrt` at tests/test_hazard_rows.py:")
    assert "sqrt of a raw parameter that gradient steps take toward 0" in w.message
    assert "softplus" in w.message


def test_the_rows_are_traced_through_the_collate_and_replayed_on_the_source() -> None:
    """The default collate's ``stack`` of ``x[i]``, a ``.float()`` and a comparison: replayed
    on the whole source, they find the rows the batch did not hold."""
    from nanguard.core.hazards import HazardBook
    from nanguard.torch._modules import ModuleStack
    from nanguard.torch.hazards import HazardMode

    y = torch.arange(1, 21)
    y[17] = 0
    mode = HazardMode(HazardBook(), ModuleStack())
    with mode:
        batch = torch.utils.data.default_collate([y[i] for i in range(4)])
        d = (batch.float() * 2 != 0).float()
    rows: RowTrace = mode.rows
    assert rows.zero_divisor(d) == "1 of 20 rows of the int64[20] tensor the batches are cut from hold a 0"
    assert rows.zero_divisor(batch.float() + 1) is None  # made outside the mode: not traced
