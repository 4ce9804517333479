"""Under ``locate()`` and ``nanguard run --trace`` every op is checked: a value an op made
non-finite from finite inputs is a finding wherever it goes; masks a softmax absorbs are not; a run
that watched no step says so. The op table can be extended for custom ops."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from torch import nn

import nanguard
from _spawn import Spawn
from nanguard import NonFiniteError
from nanguard.core import ops

ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


@pytest.fixture(autouse=True, params=["sync", "deferred"])
def _check_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each locate() test runs with checks read one by one, and deferred (as on a GPU)."""
    monkeypatch.setenv("NANGUARD_DEFERRED", "1" if request.param == "deferred" else "0")


def _find(fn) -> nanguard.Finding:  # type: ignore[no-untyped-def]
    with pytest.raises(NonFiniteError) as info:
        fn()
    return info.value.finding


# --- the scripts of issue 13, point 8 (also run under `nanguard run --trace` below) -------------

BARE_LOG0 = """
    import torch
    torch.log(torch.zeros(3))
"""

MODULE_RETURNS_LOG0 = """
    import torch, torch.nn as nn
    class Scorer(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)
        def forward(self, x):
            return torch.log(torch.relu(self.fc(x)) * 0)
    model = Scorer()
    out = model(torch.randn(2, 4))
    print(tuple(out.shape))
"""

INPLACE_INF_WEIGHTS = """
    import torch, torch.nn as nn, torch.nn.functional as F
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    x = torch.randn(16, 4)
    print(tuple(model(x).shape))
    with torch.no_grad():
        w = model[2].weight
        w.zero_()
        w.div_(w.norm(dim=1, keepdim=True))   # normalise the rows by hand: 0/0
    print(tuple(model(x).shape))
"""

METRIC_BESIDE_STEPS = """
    import torch, torch.nn as nn, torch.nn.functional as F
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    for step in range(3):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        with torch.no_grad():
            p = F.softmax(model(x) * 1e4, -1)
            entropy = -(p * torch.log(p)).sum(-1).mean()
        print(step, round(loss.item(), 3), entropy.item())
"""

NO_STEP = """
    import torch, torch.nn as nn
    model = nn.Linear(4, 2)
    with torch.no_grad():
        print(tuple(model(torch.randn(3, 4)).shape))
"""

CAUSAL_MASKS = """
    import torch, torch.nn as nn, torch.nn.functional as F
    torch.manual_seed(0)
    T = 6
    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(8, 24)
            self.register_buffer("log_mask", torch.log(torch.tril(torch.ones(T, T))))
        def forward(self, x):
            q, k, v = self.qkv(x).chunk(3, -1)
            att = q @ k.transpose(-2, -1) + self.log_mask
            att = att.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf"))
            return F.softmax(att, -1) @ v
    model = Attn()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(3):
        opt.zero_grad()
        out = model(torch.randn(2, T, 8))
        safe = torch.where(out > 0, torch.log(out), torch.zeros_like(out))  # log of <= 0 masked out
        loss = out.pow(2).mean() + 0 * safe.sum()
        loss.backward()
        opt.step()
        print(step, round(loss.item(), 4))
"""


def _run(spawn: Spawn, tmp_path: Path, body: str,
         *flags: str) -> tuple[subprocess.CompletedProcess[str], dict]:  # type: ignore[type-arg]
    (tmp_path / "train.py").write_text(textwrap.dedent(body))
    r = spawn.nanguard("run", *flags, "--json", "log.json", "train.py",
                       cwd=tmp_path, timeout=180, env=ENV)
    return r, json.loads((tmp_path / "log.json").read_text())


def _exec(body: str) -> dict[str, object]:
    """Run a script's text; its globals are returned (kept alive, as a script's are until it ends)."""
    ns: dict[str, object] = {"__name__": "train"}
    exec(compile(textwrap.dedent(body), "train.py", "exec"), ns)
    return ns


# --- through locate() ---------------------------------------------------------------------------


def test_bare_log_of_zero_is_a_finding_when_the_block_ends() -> None:
    def run() -> None:
        with nanguard.locate():
            torch.log(torch.zeros(3))

    f = _find(run)
    assert (f.op, f.phase, f.module, f.reached) == ("aten.log.default", "forward", None, "output")
    assert f.neginf == 3 and f.inputs[0].zeros == 3
    assert "unused when the locate() block ended" in f.details["note"]


def test_a_module_whose_output_is_log_of_zero_is_found() -> None:
    f = _find(lambda: _in_locate(MODULE_RETURNS_LOG0))
    assert (f.op, f.phase, f.module, f.module_type) == ("aten.log.default", "forward", "", "Scorer")
    assert f.reached == "output"


def _in_locate(body: str) -> None:
    with nanguard.locate():
        ns = _exec(body)
    del ns


def test_weights_made_nonfinite_in_place_are_found() -> None:
    f = _find(lambda: _in_locate(INPLACE_INF_WEIGHTS))
    assert (f.op, f.phase, f.module, f.reached) == ("aten.div_.Tensor", "forward", "2", "parameters")
    assert f.details["parameters"] == ["2.weight"]
    assert f.nan == 8


def test_weights_made_nonfinite_through_data_before_any_forward_are_found() -> None:
    model = nn.Sequential(OrderedDict(fc=nn.Linear(4, 3), act=nn.ReLU(), head=nn.Linear(3, 1)))

    def run() -> None:
        with nanguard.locate():
            w = model.head.weight
            w.data.div_(w.data.norm() * 0)  # .data: an alias the locator has never seen
            model(torch.randn(5, 4)).relu()

    f = _find(run)
    assert (f.op, f.phase, f.module, f.reached) == ("aten.div_.Tensor", "forward", "head", "parameters")
    assert f.details["parameters"] == ["head.weight"]


def test_an_inf_metric_beside_healthy_steps_is_found_where_it_is_read() -> None:
    f = _find(lambda: _in_locate(METRIC_BESIDE_STEPS))
    assert (f.op, f.phase, f.module, f.reached) == ("aten.log.default", "forward", None, "output")
    assert "Python read one of its values (`.item()`) at train.py:" in f.details["note"]
    assert "aten._softmax.default" in f.details["input_producers"]


def test_an_unread_nan_metric_is_found_when_the_block_ends() -> None:
    model = nn.Linear(4, 3)
    kept = []

    def run() -> None:
        with nanguard.locate(model):
            for _ in range(3):
                out = model(torch.randn(8, 4))
                out.pow(2).mean().backward()
                kept.append((out - out).div(out - out).mean())  # 0/0: kept, never read

    f = _find(run)
    assert (f.op, f.phase, f.reached) == ("aten.div.Tensor", "forward", "output")
    assert f.nan == 24


# --- harmless: no finding -----------------------------------------------------------------------


def test_causal_masks_absorbed_by_a_softmax_are_not_findings() -> None:
    with nanguard.locate() as loc:
        _exec(CAUSAL_MASKS)
    assert loc.findings == []


def test_a_log_mask_made_in_a_block_and_used_after_it_is_not_a_finding() -> None:
    with nanguard.locate() as loc:
        mask = torch.log(torch.tril(torch.ones(4, 4)))  # log of a 0/1 mask: deliberate
        full = torch.full((4,), float("-inf"))  # an explicit constant
    assert loc.findings == []
    assert torch.isinf(mask).any() and torch.isinf(full).all()
    with nanguard.locate() as loc:
        (torch.randn(4, 4) + mask).softmax(-1).sum()
    assert loc.findings == []


def test_masked_log_and_clamped_log_are_not_findings() -> None:
    x = torch.tensor([0.0, 0.5, 2.0])
    with nanguard.locate() as loc:
        a = torch.where(x > 0, torch.log(x), torch.zeros_like(x))
        b = torch.log(x).clamp(min=-100)
        c = torch.nan_to_num(torch.log(x - 1))
        total = (a + b + c).sum().item()
    assert loc.findings == [] and total == total


def test_a_log_of_a_saturated_softmax_is_no_mask() -> None:
    """Exact 0s and 1s made by a softmax are a bug, not a mask."""
    def run() -> None:
        with nanguard.locate():
            torch.log(torch.softmax(torch.tensor([[0.0, 1e4], [1e4, 0.0]]), -1))

    f = _find(run)
    assert f.op == "aten.log.default" and f.reached == "output"


def test_replay_options_report_only_sinks() -> None:
    opts = nanguard.torch.LocateOptions(on_sink="record", unused="ignore")
    with nanguard.locate(options=opts) as loc:
        torch.log(torch.zeros(3))
        torch.log(torch.zeros(2)).sum().item()
    assert loc.findings == []


def test_options_are_frozen_and_validated() -> None:
    opts = nanguard.torch.LocateOptions()
    with pytest.raises(AttributeError):
        opts.on_sink = "record"  # type: ignore[misc]
    with pytest.raises(ValueError, match="valid values: 'report', 'ignore'"):
        nanguard.torch.LocateOptions(unused="warn")  # type: ignore[arg-type]
    assert nanguard.locate(step=4, options=opts).step == 4


# --- the op table -------------------------------------------------------------------------------


def test_the_core_table_serves_both_frameworks() -> None:
    assert ops.op_traits("aten.log_.default").singular is not None
    assert ops.op_traits("RealDiv").singular == ops.op_traits("aten.div.Tensor").singular
    assert ops.op_traits("Relu").relu and ops.op_traits("aten.relu_.default").relu
    assert ops.op_traits("aten._softmax.default").safe and not ops.op_traits("aten._to_copy.default").safe
    assert ops.op_traits("aten.sqrt.default").backward_singular is not None
    assert ops.op_traits("mylib.unknown.default") == ops.OpTraits()
    assert ops.dtype_max("torch.float16") == 65504.0 and ops.dtype_max("bfloat16") == pytest.approx(3.39e38, rel=1e-3)


@torch.library.custom_op("ngtest::clip_relu", mutates_args=())
def clip_relu(x: torch.Tensor) -> torch.Tensor:
    return x.clamp_min(0)


class ClipAct(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return clip_relu(x)


def test_register_op_traits_for_a_custom_op() -> None:
    """A custom ReLU registered as one: the old TensorFlow ReluGrad note names it."""
    model = nn.Sequential(OrderedDict(act=ClipAct()))

    def run() -> nanguard.Finding:
        with pytest.raises(NonFiniteError) as info, nanguard.locate(model), torch.no_grad():
            model(torch.exp(torch.full((3,), 100.0)))  # exp overflows; the custom ReLU passes it
        return info.value.finding

    assert "relu_grad" not in run().details
    traits = nanguard.register_op_traits("ngtest::clip_relu", relu=True, safe=True)
    try:
        assert traits == ops.OpTraits(relu=True, safe=True)
        assert ops.op_traits(None, "ngtest::clip_relu") is traits
        f = run()
        assert f.op == "aten.exp.default" and "`act` (ClipAct)" in f.details["relu_grad"]
        with pytest.raises(TypeError, match="unknown trait"):
            nanguard.register_op_traits("ngtest::clip_relu", singularity="x < 0")
    finally:
        ops.unregister_op_traits("ngtest::clip_relu")
    assert "relu_grad" not in run().details


# --- through `nanguard run --trace` --------------------------------------------------------------


def _event(log: dict) -> tuple[object, ...]:  # type: ignore[type-arg]
    (ev,) = log["events"]
    return ev["op"], ev["phase"], ev["module"], ev["reached"]


@pytest.mark.parametrize("_check_mode", ["sync"], indirect=True)
@pytest.mark.parametrize(
    ("body", "expected", "source"),
    [
        (BARE_LOG0, ("aten.log.default", "forward", None, "output"), "train.py:3"),
        (MODULE_RETURNS_LOG0, ("aten.log.default", "forward", "", "output"), "train.py:8"),
        (INPLACE_INF_WEIGHTS, ("aten.div_.Tensor", "forward", "2", "parameters"), "train.py:10"),
        (METRIC_BESIDE_STEPS, ("aten.log.default", "forward", None, "output"), "train.py:14"),
    ],
    ids=["bare-log0", "module-log0", "inplace-weights", "metric"],
)
def test_trace_run_finds_what_went_nowhere(tmp_path: Path, body: str, expected: tuple[object, ...],
                                           source: str, spawn: Spawn) -> None:
    for flags in ((), ("--trace",)):
        r, log = _run(spawn, tmp_path, body, *flags)
        if flags:
            assert r.returncode == 3, r.stderr
            assert log["status"] == "nonfinite" and _event(log) == expected
            assert log["events"][0]["source"] == source and log["events"][0]["cause"] == "unsafe-op"
            assert "nanguard: the first non-finite value was made in the forward pass" in r.stderr
        elif body is not METRIC_BESIDE_STEPS:  # without --trace, nothing watched these scripts
            assert r.returncode == 0 and log["status"] == "ok" and log["events"] == []
            assert any("nothing was watched" in n for n in log["notes"])


@pytest.mark.parametrize("_check_mode", ["sync"], indirect=True)
def test_trace_run_of_causal_masks_is_healthy(tmp_path: Path, spawn: Spawn) -> None:
    plain = spawn.python("-c", textwrap.dedent(CAUSAL_MASKS), timeout=180, env=ENV)
    r, log = _run(spawn, tmp_path, CAUSAL_MASKS, "--trace")
    assert r.returncode == 0, r.stderr
    assert log["status"] == "ok" and log["events"] == [] and log["steps"] == 3
    assert r.stdout == plain.stdout and log["notes"] == []


@pytest.mark.parametrize("_check_mode", ["sync"], indirect=True)
def test_a_run_with_no_step_says_nothing_was_watched(tmp_path: Path, spawn: Spawn) -> None:
    r, log = _run(spawn, tmp_path, NO_STEP)
    note = ("no optimizer step and no backward() ran: nothing was watched; --trace checks every op "
            "(nanguard run --trace ...)")
    assert r.returncode == 0 and r.stdout == "(3, 2)\n"
    assert log["notes"] == [note] and f"nanguard: {note}" in r.stderr
    r, log = _run(spawn, tmp_path, NO_STEP, "--trace")
    assert r.returncode == 0 and log["events"] == []
    assert log["notes"] == ["no optimizer step and no backward() ran; --trace checked every op"]


@pytest.mark.parametrize("_check_mode", ["sync"], indirect=True)
def test_trace_run_judges_values_when_the_script_exits_with_status_0(tmp_path: Path,
                                                                   spawn: Spawn) -> None:
    body = BARE_LOG0 + "    import sys\n    sys.exit(0)\n"
    r, log = _run(spawn, tmp_path, body, "--trace")
    assert r.returncode == 3 and _event(log) == ("aten.log.default", "forward", None, "output")
    body = BARE_LOG0 + "    raise SystemExit(5)\n"  # the script's own failure stands
    r, log = _run(spawn, tmp_path, body, "--trace")
    assert r.returncode == 5 and log["events"] == []
    assert any("not judged" in n for n in log["notes"])
