"""The gradient through a recurrence (torch._recurrence): a module fed its own output whose
backward grows at each call is warned by the watch at its sampled step 2, with the length of
the chain that overflows; a standard or gated cell, or a chain cut by ``detach()``, is not."""

from __future__ import annotations

import io
import math
from contextlib import redirect_stderr

import pytest
import torch
from torch import nn

import nanguard
from nanguard.core.early import EarlyWarning
from nanguard.core.hazards import RECURRENCE_EDGE, HazardBook
from nanguard.torch._hazard_watch import SAMPLED_STEPS
from nanguard.torch._modules import ModuleStack
from nanguard.torch._recurrence import _fit
from nanguard.torch.hazards import HazardMode


class _Unrolled(nn.Module):
    """A cell stepped over time by hand; ``gain`` scales a normal recurrent init (1: the edge of
    chaos; 3: chaotic, the backward grows at every step)."""

    def __init__(self, cell: str = "rnn", gain: float | None = None, hidden: int = 32,
                 keep: float | None = None, cut: int | None = None) -> None:
        super().__init__()
        self.hidden, self.kind, self.keep, self.cut = hidden, cell, keep, cut
        self.cell = {"rnn": nn.RNNCell, "gru": nn.GRUCell, "lstm": nn.LSTMCell}[cell](3, hidden)
        if gain is not None:
            nn.init.normal_(self.cell.weight_hh, 0.0, gain / math.sqrt(hidden))
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.zeros(x.shape[0], self.hidden)
        c = torch.zeros_like(h)
        for t in range(x.shape[1]):
            if self.cut and t and t % self.cut == 0:
                h, c = h.detach(), c.detach()  # truncated backprop through time
            if self.kind == "lstm":
                h, c = self.cell(x[:, t], (h, c))
            else:
                h = self.cell(x[:, t], h)
            if self.keep is not None:
                h = h * self.keep  # a link through an op (a mask, a dropout)
        return self.head(h)


def _watch(model: nn.Module, length: int = 24, steps: int = 4) -> list[EarlyWarning]:
    torch.manual_seed(1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    guard = nanguard.attach(model, opt)
    try:
        with redirect_stderr(io.StringIO()):
            for _ in range(steps):
                x = torch.randn(8, length, 3)
                opt.zero_grad()
                nn.functional.mse_loss(model(x), x[:, -3:, 0].mean(1, keepdim=True)).backward()
                opt.step()
    finally:
        guard.detach()
    return list(guard.controller.early.warnings)


@pytest.mark.parametrize("keep", [None, 0.9])
def test_a_chaotic_tanh_cell_is_warned_with_the_chain_that_overflows(keep: float | None) -> None:
    torch.manual_seed(0)
    (w,) = _watch(_Unrolled(gain=3.0, keep=keep))
    assert (w.kind, w.step) == ("latent-hazard", SAMPLED_STEPS[-1])
    assert w.message.startswith("`recurrence` at tests/test_recurrence.py:")
    assert "(in cell)" in w.message and "per call of `cell` going back through its recurrence" in w.message
    calls = int(w.message.split("a chain of ~")[1].split(" calls")[0])
    assert 24 < calls <= RECURRENCE_EDGE  # longer than the sequences seen, short enough to meet
    assert "truncated backprop through time" in w.message
    assert any("self.cell(x[:, t], h)" in e for e in w.evidence)  # the line that steps the cell


@pytest.mark.parametrize(("cell", "gain", "cut"), [
    ("rnn", None, None),  # PyTorch's default init: the backward shrinks going back
    ("gru", 3.0, None),  # a gated cell, even with a large recurrent init
    ("lstm", None, None),  # (h, c) fed back as a tuple
    ("rnn", 3.0, 3),  # cut every 3 calls: no chain long enough to fit
])
def test_a_recurrence_that_does_not_grow_is_not_warned(cell: str, gain: float | None, cut: int | None) -> None:
    torch.manual_seed(0)
    assert _watch(_Unrolled(cell, gain=gain, cut=cut)) == []


def _book_of(model: nn.Module, length: int) -> HazardBook:
    """One step under the check's mode; what its book holds."""
    book = HazardBook()
    mode = HazardMode(book, ModuleStack(model))
    x = torch.randn(4, length, 3)
    with mode:
        model(x).pow(2).mean().backward()
    mode.step_done()
    return book


def test_the_fit_is_per_call_and_the_overflow_length_follows_the_dtype() -> None:
    torch.manual_seed(0)
    (h,) = [h for h in _book_of(_Unrolled(gain=3.0), 30).ranked() if h.kind == "recurrence"]
    assert (h.op, h.module, h.dtype, h.risk) == ("recurrence", "cell", "float32", "high")
    assert h.source is not None and h.source.startswith("tests/test_recurrence.py:")
    rate = float(h.pattern.split("grows ×")[1].split(" ")[0])
    assert 1.2 < rate < 3.0
    assert "over the 29 calls of a step" in h.pattern  # 30 calls: the last one's output is not fed back
    assert 29 < h.margin <= RECURRENCE_EDGE
    # a chain growing ×2 per call going back, 1.0 at its earliest call: float32's 3.4e38 is
    # 128 doublings further, float16's 65504 16
    where = ("cell", "RNNCell", None, None)
    g32 = _fit(where, "float32", [2.0 ** -i for i in range(6)])
    g16 = _fit(where, "float16", [2.0 ** -i for i in range(6)])
    assert g32 is not None and g16 is not None
    assert g32.rate == pytest.approx(2.0) and g32.total == pytest.approx(32.0) and g32.calls == 6
    assert g32.overflow_at == pytest.approx(6 + 128.0)  # float32's max is 2^128 (1 - 2^-24)
    assert g16.overflow_at == pytest.approx(6 + math.log2(65504.0))
    assert _fit(where, "float32", [1.0, 0.5, 0.25]) is None  # too short to fit
    assert _fit(where, "float32", [2.0 ** i for i in range(6)]).overflow_at == math.inf  # shrinking


def test_a_module_called_once_per_step_or_on_unrelated_inputs_is_no_recurrence() -> None:
    torch.manual_seed(0)
    lin = nn.Linear(3, 3)
    book = HazardBook()
    mode = HazardMode(book, ModuleStack(lin))
    with mode:
        ys = [lin(torch.randn(2, 3)) for _ in range(8)]  # eight calls, none fed another's output
        torch.stack(ys).pow(2).sum().backward()
    mode.step_done()
    assert [h for h in book.hazards.values() if h.kind == "recurrence"] == []


class _SharedAct(nn.Module):
    """A cell written as a Linear and a Tanh module object reused: the Tanh has no weights."""

    def __init__(self) -> None:
        super().__init__()
        self.lin, self.act = nn.Linear(3 + 32, 32), nn.Tanh()
        nn.init.normal_(self.lin.weight, 0.0, 3.0 / math.sqrt(32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.zeros(x.shape[0], 32)
        for t in range(x.shape[1]):
            h = self.act(self.lin(torch.cat([x[:, t], h], 1)))
        return h.sum(1, keepdim=True)


def test_the_recurrence_is_named_at_the_module_with_weights() -> None:
    torch.manual_seed(0)
    (h,) = [h for h in _book_of(_SharedAct(), 24).ranked() if h.kind == "recurrence"]
    assert (h.module, h.risk) == ("lin", "high")  # not `act`, which is fed its own output too


def test_a_long_sequence_that_overflows_an_expansive_cell_is_diagnosed_bad_initialization() -> None:
    """A ReLU cell whose recurrent init grows its state at every call: short sequences train,
    the long one at step 6 overflows the forward inside ``cell``; the early steps measured the
    recurrence, the weights did not grow, so the initial weights are the cause."""
    torch.manual_seed(0)
    model = _Unrolled(gain=2.5)
    model.cell.nonlinearity = "relu"
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    guard = nanguard.attach(model, opt)
    try:
        with redirect_stderr(io.StringIO()), pytest.raises(nanguard.NonFiniteError) as got:
            for step in range(8):
                x = torch.rand(8, 600 if step == 6 else 12, 3)
                opt.zero_grad()
                nn.functional.mse_loss(model(x), x[:, -1:, 0]).backward()
                opt.step()
    finally:
        guard.detach()
    f, d = got.value.finding, got.value.diagnosis
    assert (f.step, f.phase, f.module, f.op) == (6, "forward", "cell", "aten.addmm.default")
    assert d is not None and (d.cause.value, d.rule) == ("bad-initialization", "expansive_recurrence")
    assert any("`cell` is a recurrence" in e for e in d.evidence)


class _ConvCell(nn.Module):
    """A cell whose recurrent weight is a submodule: ``hh`` is fed its own output too, through
    the cell; the cell is the recurrence."""

    def __init__(self) -> None:
        super().__init__()
        self.xh, self.hh = nn.Linear(3, 32), nn.Linear(32, 32)
        nn.init.normal_(self.hh.weight, 0.0, 3.0 / math.sqrt(32))

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.xh(x) + self.hh(h))


class _WithConvCell(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = _ConvCell()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.zeros(x.shape[0], 32)
        for t in range(x.shape[1]):
            h = self.cell(x[:, t], h)
        return h.sum(1, keepdim=True)


def test_a_recurrence_inside_a_recurrence_is_named_at_the_outer_module() -> None:
    torch.manual_seed(0)
    hazards = [h for h in _book_of(_WithConvCell(), 24).ranked() if h.kind == "recurrence"]
    assert [(h.module, h.risk) for h in hazards] == [("cell", "high")]  # not also `cell.hh`
    assert hazards[0].source_code == "h = self.cell(x[:, t], h)"
