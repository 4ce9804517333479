"""A data finding says which dataset row it was (through the loader's sampler, shuffled or not,
with worker processes or without), under which key of the batch, and whether the dataset holds
that row non-finite or reading the sample made it."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nanguard
from nanguard import Cause, NonFiniteError


class _Rows(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Dict samples; row 29's label is NaN in what the dataset holds."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(200, 6, generator=g)
        self.y = self.x.sum(1, keepdim=True)
        self.y[29] = float("nan")

    def __len__(self) -> int:
        return 200

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"features": self.x[i], "labels": self.y[i]}


class _Tiles(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Tiles standardised one by one as they are read: tile 41 is blank (0/0)."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.tiles = torch.rand(120, 1, 4, 4, generator=g)
        self.tiles[41] = 0.5
        self.labels = torch.randint(0, 3, (120,), generator=g)

    def __len__(self) -> int:
        return 120

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        t = self.tiles[i]
        return (t - t.mean()) / t.std(), self.labels[i]


def _train(ds: Any, model: nn.Module, loss: Any, workers: int = 0) -> Any:
    torch.manual_seed(1)
    dl = torch.utils.data.DataLoader(ds, batch_size=16, shuffle=True, num_workers=workers)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with pytest.raises(NonFiniteError) as info, nanguard.attach(model, opt):
        for _ in range(3):
            for batch in dl:
                opt.zero_grad()
                loss(model, batch).backward()
                opt.step()
    return info.value


def _dict_loss(model: nn.Module, b: dict[str, torch.Tensor]) -> torch.Tensor:
    return F.mse_loss(model(b["features"]), b["labels"])


@pytest.mark.parametrize("workers", [0, 2])
def test_a_shuffled_dict_batch_names_the_dataset_row_and_the_key(workers: int) -> None:
    err = _train(_Rows(), nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1)), _dict_loss, workers)
    f, d = err.finding, err.diagnosis
    assert (f.phase, f.details["origin"], f.details["input_name"]) == ("data", "data", "the batch's `['labels']`")
    (sample,) = f.details["samples"]
    assert sample["dataset_index"] == 29  # its position in the shuffled batch is another number
    assert d is not None and d.cause is Cause.NONFINITE_INPUT
    assert d.evidence[0] == (f"dataset index 29 (sample {sample['index']} of the batch's `['labels']`), "
                             "feature 0 is NaN")
    assert "read_computed" not in f.details  # the dataset holds it: the data is what to fix


def test_a_nan_made_in_getitem_is_told_from_bad_data() -> None:
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 3))
    err = _train(_Tiles(), model, lambda m, b: F.cross_entropy(m(b[0]), b[1]))
    f, d = err.finding, err.diagnosis
    assert f.details["read_computed"] == "_Tiles.__getitem__"
    assert [s.get("dataset_index") for s in f.details["samples"]] == [41]
    assert d is not None and d.cause is Cause.NONFINITE_INPUT
    assert d.summary.startswith("reading a sample made ") and d.summary.endswith("(`_Tiles.__getitem__`)")
    assert d.evidence[0].startswith("the values the dataset holds for index 41 are finite")
    assert d.fixes[1] == "sample = dataset[41]  # the sample that failed: step through `_Tiles.__getitem__` with it"
    assert not any("dropna" in fix or "scan" in fix for fix in d.fixes)
