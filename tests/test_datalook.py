"""The look at the data ahead (torch._datapeek): a few NaN/Inf a dataset or the script already
holds are warned about before the batch that reads them — and masks, markers, weights and
activations are not data."""

from __future__ import annotations

import io
from collections.abc import Callable
from contextlib import redirect_stderr
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

import nanguard
from nanguard import NonFiniteError
from nanguard.core.early import EarlyWarning
from nanguard.torch._datapeek import peek_dataset


def _train(batches: Callable[[], Any], steps: int = 40) -> tuple[list[EarlyWarning], int | None, str]:
    """Train a small regressor on ``batches()`` (an iterable of ``(x, y)``) under ``raise``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    err, nan_step, n = io.StringIO(), None, 0
    guard = nanguard.attach(model, opt)
    try:
        with redirect_stderr(err):
            for x, y in batches():
                opt.zero_grad()
                F.mse_loss(model(x), y).backward()
                opt.step()
                n += 1
                if n == steps:
                    break
    except NonFiniteError as e:
        nan_step = e.finding.step
    finally:
        guard.detach()
    return list(guard.controller.early.warnings), nan_step, err.getvalue()


def _table(n: int = 640, bad_row: int | None = 333, value: float = float("nan")) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(n, 6, generator=g), torch.randn(n, 1, generator=g)
    if bad_row is not None:
        x[bad_row, 2] = value
    return x, y


def test_a_nan_cell_in_a_tensor_dataset_is_warned_at_step_0_with_the_step_that_reads_it() -> None:
    x, y = _table()
    warnings, nan_step, printed = _train(lambda: DataLoader(TensorDataset(x, y), batch_size=32))
    (w,) = warnings
    assert (w.kind, w.step, w.projected_step, nan_step) == ("data-nonfinite", 0, 10, 10)  # 333 // 32
    assert "`TensorDataset.tensors[0]` (a dataset) holds 1 NaN in 1 of its 640 rows (first: row 333)" in w.message
    assert "nanguard: warning at step 0 (data-nonfinite)" in printed
    assert "the loader reaches it at step 10" in printed


def test_a_shuffled_loader_or_a_subset_has_no_projected_step() -> None:
    x, y = _table()
    shuffled = _train(lambda: DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True,
                                         generator=torch.Generator().manual_seed(0)), steps=3)[0]
    sub = _train(lambda: DataLoader(Subset(TensorDataset(x, y), list(range(600))), batch_size=32), steps=3)[0]
    assert [(w.kind, w.projected_step) for w in shuffled] == [("data-nonfinite", None)]
    assert [(w.kind, w.projected_step) for w in sub] == [("data-nonfinite", None)]


def test_the_earliest_bad_row_of_a_dataset_is_the_one_projected() -> None:
    x, y = _table()
    y[70, 0] = float("inf")
    warnings, nan_step, _ = _train(lambda: DataLoader(TensorDataset(x, y), batch_size=32))
    (w,) = warnings
    assert (w.projected_step, nan_step) == (70 // 32, 70 // 32)
    assert w.message.startswith("`TensorDataset.tensors[1]` (a dataset) holds 1 Inf")


class _Windows(Dataset):  # type: ignore[type-arg]
    """Windows of 8 rows over one series: sample i reads rows i..i+7, so rows are not samples."""

    def __init__(self, series: torch.Tensor, target: torch.Tensor) -> None:
        self.series, self.target = series, target

    def __len__(self) -> int:
        return len(self.series) - 7

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.series[i:i + 8].mean(0), self.target[i + 7]


def test_a_dataset_whose_rows_are_not_its_samples_has_no_projected_step() -> None:
    x, y = _table()
    warnings, nan_step, _ = _train(lambda: DataLoader(_Windows(x, y), batch_size=32))
    (w,) = warnings
    assert (w.kind, w.step, w.projected_step) == ("data-nonfinite", 0, None)
    assert "holds 1 NaN in 1 of its 640 rows (first: row 333)" in w.message
    assert nan_step == 10  # window 326..333 is sample 326, in batch 10; the projection would be luck


class _Samples(Dataset):  # type: ignore[type-arg]
    """Per-sample tensors in a list, as a CSV parser builds them; counts ``__getitem__`` calls."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = list(x), list(y)
        self.calls = 0

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls += 1
        return self.x[i], self.y[i]


def test_a_list_of_samples_is_read_without_calling_getitem() -> None:
    x, y = _table(value=float("inf"))
    ds = _Samples(x, y)
    (p,) = peek_dataset(ds)
    assert (p.name, p.inf, p.nan, p.rows, p.first_row, p.total_rows) == ("_Samples.x", 1, 0, 1, 333, 640)
    assert ds.calls == 0


def test_the_script_own_tensors_sliced_by_hand_are_looked_at_after_the_first_step() -> None:
    x_all, y_all = _table(bad_row=300)

    def batches() -> Any:
        for i in range(0, 640, 16):
            yield x_all[i:i + 16], y_all[i:i + 16]

    warnings, nan_step, _ = _train(batches)
    (w,) = warnings
    assert (w.kind, w.step, w.projected_step, nan_step) == ("data-nonfinite", 0, None, 18)
    assert w.message.startswith("`x_all` (the script's variables) holds 1 NaN")


def test_masks_markers_and_healthy_data_are_not_warned_about() -> None:
    causal = torch.full((32, 32), float("-inf")).triu(1)  # noqa: F841 — a mask: half of it -inf
    marked = np.random.default_rng(0).normal(size=(640, 6))
    marked[::3, 4] = np.nan  # a column the script masks: 6 % NaN
    x, y = _table(bad_row=None)
    warnings, nan_step, printed = _train(lambda: DataLoader(TensorDataset(x, y), batch_size=32))
    assert (warnings, nan_step, printed) == ([], None, "")
    assert peek_dataset(TensorDataset(torch.tensor(marked), y)) == []
