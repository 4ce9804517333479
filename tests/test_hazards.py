"""nanguard.check() / nanguard check: unsafe ops on the path to the loss, with their margin and
pattern, before they make a NaN — and nothing risky on code written the safe way."""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nanguard
from _spawn import Spawn
from nanguard.core.hazards import Hazard, HazardBook, assess, trend_warning

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _train(loss_fn: LossFn, steps: int = 5, opt_cls: type = torch.optim.SGD, **kw: float) -> list[Hazard]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 4))
    opt = opt_cls(model.parameters(), lr=kw.get("lr", 0.1))
    x, y = torch.randn(32, 6), torch.randint(0, 4, (32,))
    with nanguard.check(steps=steps) as hz:
        for _ in range(100):  # stopped by the check after `steps` steps
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
    assert hz.steps == steps
    return hz.hazards


def _risky(hazards: list[Hazard]) -> list[Hazard]:
    return [h for h in hazards if h.risk in ("high", "medium")]


def test_log_of_a_softmax_is_found_at_its_line_with_its_stable_form() -> None:
    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        p = torch.softmax(out, -1)
        return -torch.log(p).gather(1, y[:, None]).mean()  # the hazard

    (h,) = _risky(_train(loss))
    assert (h.op, h.pattern, h.kind) == ("log", "log of a softmax", "zero")
    assert h.source is not None and h.source.endswith(f"test_hazards.py:{_line('the hazard', 0)}")
    assert h.stable_form is not None and "log_softmax" in h.stable_form
    assert len(h.margins) == 5 and 0 < h.margin < 1  # one margin per step, a probability


def _line(marker: str, nth: int) -> int:
    lines = Path(__file__).read_text().splitlines()
    return [i + 1 for i, s in enumerate(lines) if f"# {marker}" in s][nth]


def test_the_safe_forms_leave_nothing_risky() -> None:
    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        d = (out[:, :2] - out[:, 2:]).pow(2).sum(-1).add(1e-8).sqrt()  # eps inside the sqrt
        return F.cross_entropy(out, y) + F.logsigmoid(out[:, 0]).mean() * -0.1 + 0.01 * d.mean()

    assert _risky(_train(loss)) == []


def test_sqrt_of_a_sum_of_squares_and_a_hand_written_softmax_are_patterns() -> None:
    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        d = ((out[:, :2] - out[:, 2:]) ** 2).sum(-1).sqrt()  # a distance
        e = torch.exp(out)  # the exp
        p = e / e.sum(-1, keepdim=True)  # a softmax
        return d.mean() * 0.01 + F.nll_loss(torch.log(p + 1e-9), y)

    risky = {(h.op, h.pattern) for h in _risky(_train(loss))}
    assert ("sqrt", "sqrt of a sum of squares (its gradient is infinite where the sum is 0)") in risky
    # the exp is what overflows: the pattern, found at the division, is named at the exp's line
    (soft,) = [h for h in _risky(_train(loss)) if (h.pattern or "").startswith("a hand-written softmax")]
    assert soft.op == "exp" and soft.source is not None
    assert soft.source.endswith(f"test_hazards.py:{_line('the exp', 0)}")


def test_a_softmax_that_subtracts_the_max_is_not_a_pattern() -> None:
    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        e = torch.exp(out - out.max(-1, keepdim=True).values)
        return F.nll_loss(torch.log(e / e.sum(-1, keepdim=True) + 1e-9), y)

    assert all(h.pattern is None or "softmax" not in h.pattern for h in _train(loss))


def test_optimizer_and_no_grad_ops_are_not_watched() -> None:
    """Adam's sqrt sees 1e-17 and an accuracy divides by tiny numbers: neither is a hazard."""
    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            _ = (out.argmax(-1) == y).float().sum() / torch.tensor(1e-10)  # a metric
        return F.cross_entropy(out, y)

    hazards = _train(loss, opt_cls=torch.optim.Adam, lr=1e-3)
    assert hazards == []


def test_a_masked_mean_is_risky_once_its_count_comes_down_to_one() -> None:
    """A division by a sum (a mask's count) is one masked element from 0 when the count is 1;
    with a wide count the pattern is listed, not ranked risky."""
    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros(32, 4)
        mask[:, 0] = 1.0  # every row keeps one element ...
        mask[16:, 1:] = 1.0  # ... half of them all four
        per_row = (out * mask).sum(1) / mask.sum(1)  # the row mean
        everyone = (y > 0).float()
        per = F.cross_entropy(out, y, reduction="none")
        return (per * everyone).sum() / everyone.sum() + 1e-3 * per_row.pow(2).mean()  # the batch mean

    hz = {h.source: h for h in _train(loss) if h.op == "div"}
    row = hz[f"tests/test_hazards.py:{_line('the row mean', 0)}"]
    batch = hz[f"tests/test_hazards.py:{_line('the batch mean', 0)}"]
    assert (row.risk, row.margin) == ("medium", 1.0) and "sum" in str(row.pattern)
    assert batch.risk == "low" and batch.margin > 1 and any("still wide" in r for r in batch.reasons)


def test_float16_headroom_and_exp_edge() -> None:
    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        big = (out.half() * 2000.0).float()  # within 64× of float16's 65504 once |out| > 0.5
        return F.cross_entropy(out, y) + 1e-9 * big.sum() + 1e-30 * torch.exp(out + 80.0).sum()

    by_op = {h.op: h for h in _train(loss)}
    assert by_op["float16"].kind == "headroom" and by_op["float16"].risk in ("high", "medium")
    assert by_op["exp"].risk == "high" and by_op["exp"].margin < 10  # e-folds left before overflow


def test_assess_judges_margin_and_pattern_separately() -> None:
    book = HazardBook()
    for step, m in enumerate([1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7]):
        book.observe("log", "zero", m, step=step, dtype="float32", source="t.py:1", source_code=None,
                     module="head")
    book.observe("log", "zero", 0.5, step=0, dtype="float32", source="t.py:2", source_code=None,
                 module=None)
    near, wide = book.ranked()
    assert (near.risk, near.source) == ("high", "t.py:1")
    # medians of the first and last thirds (1e-2 and 1e-6): one noisy step makes no trend
    assert any("shrank ×1e+04 over 6 steps" in r for r in near.reasons)
    assert (wide.risk, wide.source) == ("low", "t.py:2")  # a wide margin, no pattern: listed only
    sub = assess(Hazard("log", "zero", "t.py:3", None, None, "float32", margins={0: 1e-39}))
    assert sub.risk == "high" and "subnormal" in sub.reasons[0]


LATENT = """
    import argparse, torch
    p = argparse.ArgumentParser(); p.add_argument("--steps", type=int, default=500)
    steps = p.parse_args().steps
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(5, 3))
    opt = torch.optim.SGD([w], lr=0.1)
    x, y = torch.randn(64, 5), torch.randint(0, 3, (64,))
    for step in range(steps):
        opt.zero_grad()
        SAFE
        loss.backward()
        opt.step()
    print("trained", step + 1)
"""


@pytest.mark.parametrize("safe", [False, True])
def test_the_cli_stops_after_n_steps_and_exits_by_risk(tmp_path: Path, safe: bool,
                                                      spawn: Spawn) -> None:
    line = ("loss = torch.nn.functional.cross_entropy(x @ w, y)" if safe else
            "loss = -torch.log(torch.softmax(x @ w, -1)).gather(1, y[:, None]).mean()")
    (tmp_path / "train.py").write_text(textwrap.dedent(LATENT).replace("SAFE", line))
    r = spawn.nanguard("check", "--steps", "7", "--json", "hz.json", "train.py", cwd=tmp_path,
                       timeout=300)
    assert "trained" not in r.stdout  # stopped after 7 steps, not run to the end
    log = json.loads((tmp_path / "hz.json").read_text())
    assert log["steps"] == 7
    if safe:
        assert r.returncode == 0 and log["hazards"] == [], r.stderr
    else:
        assert r.returncode == 5, r.stderr
        (h,) = log["hazards"]
        assert (h["op"], h["source"], h["pattern"]) == ("log", "train.py:11", "log of a softmax")
        assert "use: torch.log_softmax" in r.stderr


def test_a_floor_under_the_input_is_not_a_narrow_margin() -> None:
    """log(p + 1e-12) is finite for every p >= 0: its margin is the floor's, not a hazard."""
    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        p = torch.sigmoid(out * 40.0)  # saturates: p reaches ~1e-17
        return -torch.log(p + 1e-12).mean() * 1e-3 + F.cross_entropy(out, y)

    (h,) = [h for h in _train(loss) if h.op == "log"]
    assert h.guarded and h.risk == "low" and h.margin < 1e-6
    assert "guarded" in h.reasons[0]


def test_a_shrinking_margin_is_projected_to_its_edge() -> None:
    book = HazardBook()
    for step in range(50):  # ×0.9 a step from 0.5: 1e-6 is ~75 steps after the last, ~84 after the last third
        book.observe("log", "zero", 0.5 * 0.9 ** step, step=step, dtype="float32", source="t.py:1",
                     source_code=None, module=None)
        book.observe("exp", "overflow", 80.0 - 0.05 * step, step=step, dtype="float32", source="t.py:2",
                     source_code=None, module=None)
    by_op = {h.op: h for h in book.ranked()}
    log, exp = by_op["log"], by_op["exp"]
    assert log.risk == "medium" and log.projected is not None and 70 <= log.projected <= 95  # from the last third
    assert any("in ~" in r for r in log.reasons)
    # 77.55 e-folds left, falling 0.05 a step: the edge is ~1350 steps away, beyond 20 × 50
    assert exp.risk == "low" and exp.projected is not None and 1300 < exp.projected < 1400


def test_acos_of_a_cosine_is_a_pattern_and_a_clamp_inside_one_guards_it() -> None:
    """acos(cosine_similarity) is NaN once rounding takes the cosine past 1, and its gradient
    is infinite at 1: risky whatever its margin; clamped strictly inside ±1 it is not."""
    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ang = torch.acos(F.cosine_similarity(out[:, :2], out[:, 2:], dim=1))  # the angle
        return F.cross_entropy(out, y) + 1e-3 * ang.mean()

    def clamped(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        c = F.cosine_similarity(out[:, :2], out[:, 2:], dim=1).clamp(-1 + 1e-7, 1 - 1e-7)
        return F.cross_entropy(out, y) + 1e-3 * torch.acos(c).mean()

    (h,) = [h for h in _risky(_train(loss)) if h.op == "acos"]
    assert (h.kind, h.risk) == ("edge", "medium") and "cosine-like" in str(h.pattern)
    assert h.source is not None and h.source.endswith(f"test_hazards.py:{_line('the angle', 0)}")
    assert 0 < h.margin < 1 and h.stable_form is not None and "clamp" in h.stable_form
    (g,) = [h for h in _train(clamped) if h.op == "acos"]
    assert (g.risk, g.guarded, g.pattern) == ("low", True, None)

    def to_one(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # clamp(-1, 1): the edge itself
        c = F.cosine_similarity(out[:, :2], out[:, 2:], dim=1).clamp(-1.0, 1.0)
        return F.cross_entropy(out, y) + 1e-3 * torch.acos(c).mean()

    (e,) = [h for h in _risky(_train(to_one)) if h.op == "acos"]
    assert (e.risk, e.guarded) == ("medium", False) and "cosine-like" in str(e.pattern)


class _Standardize(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - x.mean(1, keepdim=True)) / x.std(1, keepdim=True)  # per sample


def test_a_data_only_op_is_watched_once_its_result_meets_the_graph() -> None:
    """A per-sample standardisation inside the model computes on data only (nothing requires
    grad yet), but its result reaches the loss: its division is a hazard, in its module. A mask
    made from data (log of a tril, -inf by design) and a data-only division that never meets the
    graph and one that ran once at start-up are not."""
    torch.manual_seed(0)
    model = nn.Sequential(_Standardize(), nn.Linear(6, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 6), torch.randint(0, 4, (32,))
    with nanguard.check(steps=3) as hz:
        x = x / x.norm(dim=1, keepdim=True)  # the dataset prepared once: a division by a norm
        for _ in range(10):
            opt.zero_grad()
            mask = torch.log(torch.tril(torch.ones(4, 4)))  # 0 and -inf: a causal mask
            out = model(x)
            loss = F.cross_entropy(out + mask[-1], y)
            _ratio = (y > 0).float().sum() / (y >= 0).float().sum()  # grad enabled, never on the graph
            loss.backward()
            opt.step()
    (h,) = hz.hazards
    assert (h.op, h.module, h.risk) == ("div", "0", "medium")
    assert h.pattern == "by a standard deviation without eps" and h.stable_form is not None
    assert h.source is not None and h.source.endswith(f"test_hazards.py:{_line('per sample', 0)}")
    assert len(h.margins) == 3 and h.margin > 0


MADE_NAN = """
    import torch, torch.nn as nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e6)   # step 0's update saturates the sigmoid
    x, y = torch.randn(32, 4), torch.rand(32, 1)
    for step in range(20):
        p = torch.sigmoid(model(x))
        loss = -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_a_nan_made_within_the_checked_steps_is_the_finding_exit_3(tmp_path: Path,
                                                                  spawn: Spawn) -> None:
    """The script's log(sigmoid) meets exactly 0 at step 1 of 10 checked: the check exits 3 with
    the finding, as documented (it exited 5, "risky", with a margin read from that 0)."""
    (tmp_path / "train.py").write_text(textwrap.dedent(MADE_NAN))
    r = spawn.nanguard("check", "--steps", "10", "--json", "hz.json", "train.py", cwd=tmp_path,
                       timeout=300)
    assert r.returncode == 3, r.stderr
    assert "the first non-finite value was made in the forward pass at step 1" in r.stderr
    assert "op        aten.log.default" in r.stderr and "cause: unsafe-op" in r.stderr
    h = json.loads((tmp_path / "hz.json").read_text())["hazards"][0]
    assert h["op"] == "log" and h["margin"] == 0


def test_an_input_at_exactly_zero_is_not_called_subnormal() -> None:
    def hazard(margin: float) -> Hazard:
        return assess(Hazard(op="log", kind="zero", source="t.py:1", source_code=None, module=None,
                             dtype="float32", margins={0: 0.5, 1: margin}))

    h = hazard(0.0)
    assert h.risk == "high" and h.reasons[0] == "its input reached exactly 0: `log` is at its singularity there"
    assert hazard(1e-40).reasons[0].startswith("its input went subnormal (1e-40 < 1.18e-38)")


def test_a_keras_script_is_one_clear_line_and_a_nonzero_exit(tmp_path: Path, spawn: Spawn) -> None:
    pytest.importorskip("keras")
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import numpy as np, keras
        x = np.random.randn(64, 3).astype("float32")
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        m.compile("sgd", "mse")
        m.fit(x, x.sum(1, keepdims=True), epochs=1, verbose=0)
    """))
    r = spawn.nanguard("check", "--steps", "3", "train.py", cwd=tmp_path, timeout=300)
    assert r.returncode == 2, r.stderr
    assert ("nanguard check: train.py trained with Keras, whose ops the check does not see" in r.stderr)
    assert "0 unsafe ops" not in r.stderr and "nothing was watched" not in r.stderr


def test_an_exp_past_overflow_is_said_so_and_warns_no_more() -> None:
    """Its margin (ln(max) - max input) is negative: the exp made inf already; no "-2e6 e-folds
    left", and no warning that it "can make a NaN it has not made yet"."""
    from nanguard.core.hazards import early_warning

    h = assess(Hazard(op="exp", kind="overflow", source="t.py:3", source_code=None, module=None,
                      dtype="float32", margins={1: 40.0, 2: -2095032.8}))
    assert h.risk == "high" and h.reasons[0] == "its input passed ln(float32 max): it overflowed to inf there"
    assert not any("e-folds left" in r for r in h.reasons)
    assert early_warning(h, step=2, steps=2) is None
    near = assess(Hazard(op="exp", kind="overflow", source="t.py:3", source_code=None, module=None,
                         dtype="float32", margins={1: 40.0, 2: 5.0}))
    w = early_warning(near, step=2, steps=2)
    assert w is not None and "can make a NaN it has not made yet" in w.message


def _sampled(kind: str, margins: dict[int, float], op: str = "log", guarded: bool = False,
             dtype: str = "float32") -> Hazard:
    h = Hazard(op, kind, "train.py:30", "y = torch.log(x)", None, dtype, guarded=guarded)
    h.margins = dict(margins)
    return h


_SAMPLES = (1, 2, 25, 50, 75)


def test_a_straight_walk_to_zero_over_the_sampled_steps_is_a_trend_warning() -> None:
    w = trend_warning(_sampled("zero", {s: 1.0 - s / 100 for s in _SAMPLES}), 75)
    assert w is not None and w.kind == "margin-shrinking" and w.projected_step == 100
    assert w.message == ("`log` at train.py:30: its smallest input fell 0.98 → 0.25 over steps 2–75, on a "
                         "straight line (R² 1.00); at this rate it reaches 0 at step ~100")


def test_a_saturating_curve_a_rise_noise_a_far_edge_or_a_floor_is_no_trend_warning() -> None:
    saturating = {s: 0.2 + 0.8 * math.exp(-s / 20) for s in _SAMPLES}  # levels off at 0.2
    assert trend_warning(_sampled("zero", saturating), 75) is None
    noisy = dict(zip(_SAMPLES, (1.0, 0.9, 0.95, 0.5, 0.6)))
    assert trend_warning(_sampled("zero", noisy), 75) is None
    far = {s: 1.0 - s / 1000 for s in _SAMPLES}  # reaches 0 at step 1000: too far to say yet
    assert trend_warning(_sampled("zero", far), 75) is None
    assert trend_warning(_sampled("zero", {s: 1.0 - s / 100 for s in _SAMPLES}, guarded=True), 75) is None
    at_zero = {**{s: 1.0 - s / 100 for s in _SAMPLES[:-1]}, 75: 0.0}  # it fired: a finding, not a warning
    assert trend_warning(_sampled("zero", at_zero), 75) is None


def test_a_float16_result_doubling_toward_its_largest_value_is_a_geometric_trend() -> None:
    room = {s: 2.0 ** (8 - s / 25) for s in _SAMPLES}  # ×2 less room every 25 steps: 1 at step 200
    w = trend_warning(_sampled("headroom", room, op="float16", dtype="float16"), 75)
    assert w is None  # 125 steps ahead: beyond the horizon
    room = {s: 2.0 ** (5 - s / 25) for s in _SAMPLES}  # reaches 1 (the largest value) at step 125
    w = trend_warning(_sampled("headroom", room, op="float16", dtype="float16"), 75)
    assert w is not None and w.projected_step == 125 and "on a geometric line" in w.message
    assert "its room below float16's largest value fell" in w.message


def test_a_data_feature_stacked_with_others_is_on_the_path_and_its_zero_rows_are_found() -> None:
    """A click-through rate computed on the fly from raw counters (``clicks / impressions``),
    stacked with other features into the model's input: the stack took a list, and the check
    did not follow the held division through it (0 unsafe ops); the counters made before the
    first step were not a source either (the check sees the script make its data). A campaign
    launched late has rows of 0 impressions the first batches never reach."""
    torch.manual_seed(0)
    m = nn.Linear(2, 1)
    opt = torch.optim.Adam(m.parameters())
    with nanguard.check(steps=5) as hz:
        imp = torch.poisson(torch.full((1000,), 40.0))  # made under the check, before the first step
        clk = torch.binomial(imp, torch.full((1000,), 0.1))
        imp[900], clk[900] = 0.0, 0.0
        y = torch.rand(1000)
        for s in range(5):
            i = torch.arange(s * 100, s * 100 + 100)
            im, ck = imp[i], clk[i]
            x = torch.stack([torch.log1p(im), ck / im], dim=1)
            loss = F.mse_loss(m(x).squeeze(-1), y[i])
            opt.zero_grad()
            loss.backward()
            opt.step()
    div = next(h for h in hz.hazards if h.op == "div")
    assert div.risk == "medium" and div.source_code == "x = torch.stack([torch.log1p(im), ck / im], dim=1)"
    assert div.pattern == ("division by data that is 0 on some rows: 1 of 1000 rows of the float32[1000] "
                           "tensor the batches are cut from hold a 0")
    assert any(h.op == "log1p" for h in hz.hazards)


class _NaiveSoftplus(torch.autograd.Function):
    """A custom Function whose own forward is naive (runs with grad off inside ``apply``)."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return torch.log1p(torch.exp(x))  # the naive forward

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors  # type: ignore[attr-defined]
        return g * torch.sigmoid(x)


class _NaiveLseBackward(torch.autograd.Function):
    """Log-sum-exp with a stable forward (minus the max) and a naive backward (exp / sum exp)."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, s: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(s)
        m = s.max(-1, keepdim=True).values
        return (m + torch.log(torch.exp(s - m).sum(-1, keepdim=True))).squeeze(-1)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, g: torch.Tensor) -> torch.Tensor:
        (s,) = ctx.saved_tensors  # type: ignore[attr-defined]
        w = torch.exp(s)
        return g[:, None] * w / w.sum(-1, keepdim=True)  # the naive backward


class _Head(nn.Module):
    def __init__(self, fn: type[torch.autograd.Function]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn.apply(x)  # type: ignore[no-any-return]


def _custom(fn: type[torch.autograd.Function]) -> list[Hazard]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 4), _Head(fn))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 6)
    with nanguard.check(steps=2) as hz:
        for _ in range(10):
            opt.zero_grad()
            model(x).mean().backward()
            opt.step()
    return hz.hazards


def test_a_custom_functions_own_forward_is_on_the_path_to_the_loss() -> None:
    """``Function.apply`` runs ``forward`` with grad off: its ops were taken for a metric's."""
    (h,) = _risky(_custom(_NaiveSoftplus))
    assert (h.op, h.pattern, h.module) == ("log1p", "log1p(exp(x))", "1")
    assert h.source is not None and h.source.endswith(f"test_hazards.py:{_line('the naive forward', 0)}")
    assert torch.autograd.Function.__dict__["apply"].__func__.__module__ == "torch.autograd.function"
    assert nanguard_left_patched() == []


def test_a_custom_functions_own_backward_is_looked_at_in_the_module_of_its_forward() -> None:
    """The engine runs ``backward`` with grad off, in no module: the hand-written softmax of a
    naive backward is found, named in the module whose forward applied the Function; the stable
    log-sum-exp of its forward (minus the max: a sum of at least 1) is not a pattern."""
    hazards = _custom(_NaiveLseBackward)
    (h,) = _risky(hazards)
    assert h.pattern is not None and h.pattern.startswith("a hand-written softmax")
    assert h.module == "1"
    assert h.source is not None and h.source.endswith(f"test_hazards.py:{_line('the naive backward', 0)}")
    assert all(h.pattern != "log of a sum of exp" for h in hazards)
    assert nanguard_left_patched() == []


def test_a_log_of_a_sum_of_exp_without_the_max_is_still_a_pattern() -> None:
    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.log(torch.exp(out).sum(-1)).mean() - out.gather(1, y[:, None]).mean()

    assert any(h.pattern == "log of a sum of exp" for h in _risky(_train(loss)))


def nanguard_left_patched() -> list[str]:
    from nanguard.core.patches import left_patched

    return left_patched()


@pytest.mark.parametrize("form", ["half", "float", "minus max"])
def test_an_exp_in_float16_is_a_pattern_unless_taken_in_float32_or_minus_the_max(form: str) -> None:
    """Under CPU autocast a float16 ``exp`` of a learned log-rate has 11.09 e-folds of room: a
    hazard at the first step, long before the log-rate has grown there."""
    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.float16):
            z = out.half() if form == "half" else out.float()
            if form == "minus max":
                z = z.half() - z.half().max()
            rate = torch.exp(z)
        return (rate.float() - z.float()).mean() + 0 * y.sum()

    half = [h for h in _risky(_train(loss)) if h.op == "exp"]
    if form == "half":
        (h,) = half
        assert h.dtype == "float16" and h.pattern is not None and "11.09" in h.pattern
        assert h.stable_form is not None and "x.float()" in h.stable_form
    else:
        assert half == []


def _hand_written_lars(eps: float, steps: int) -> tuple[list[Hazard], int, int]:
    """A hand-written LARS (no torch.optim): the trust ratio |w| / |g| under no_grad, through a
    momentum buffer into the weights. The check's hazards, its steps and the updates that ran."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    bufs = [torch.zeros_like(p) for p in model.parameters()]
    x, y = torch.randn(32, 6), torch.randint(0, 3, (32,))
    updates = 0
    with nanguard.check(steps=steps) as hz:
        for _ in range(100):  # stopped by the check when the backward after the last step begins
            for p in model.parameters():
                p.grad = None
            F.multi_margin_loss(model(x), y).backward()
            with torch.no_grad():
                for p, buf in zip(model.parameters(), bufs):
                    assert p.grad is not None
                    g = p.grad.norm()
                    trust = 0.02 * p.norm() / (g + eps if eps else g)
                    buf.mul_(0.9).add_(p.grad * trust)
                    p.sub_(0.1 * buf)
            updates += 1
    return hz.hazards, hz.steps, updates


def test_a_hand_written_updates_division_by_a_gradient_norm_is_a_pattern_and_its_steps_are_counted() -> None:
    hazards, steps, updates = _hand_written_lars(0.0, 4)
    assert (steps, updates) == (4, 4)
    (h,) = _risky(hazards)
    assert (h.op, h.pattern, h.module) == ("div", "division by a norm that can be 0", None)
    assert h.source_code == "trust = 0.02 * p.norm() / (g + eps if eps else g)"


def test_a_hand_written_update_with_a_floor_under_its_divisor_is_not_risky() -> None:
    hazards, steps, _ = _hand_written_lars(1e-8, 3)
    assert steps == 3 and _risky(hazards) == []


@pytest.mark.parametrize("as_float", [False, True])
def test_a_mean_over_the_model_values_that_pass_a_test_is_a_pattern(as_float: bool) -> None:
    """A hinge loss averaged over its active terms (``losses.sum() / (losses > 0).sum()``, the
    count an integer tensor or cast to float): training drives the count to 0 — risky however
    many are active now; a mean over a data mask's count stays the wide-count case."""
    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        losses = F.relu(1.0 - out.gather(1, y[:, None]).squeeze(1) + out.mean(1))
        active = losses > 0
        return losses.sum() / (active.float().sum() if as_float else active.sum())  # the active mean

    (h,) = _risky(_train(loss))
    assert (h.op, h.risk) == ("div", "medium") and str(h.pattern).startswith("division by the number of the model's")
    assert h.source is not None and h.source.endswith(f"test_hazards.py:{_line('the active mean', 0)}")
    assert h.margin >= 1  # many are active now: the pattern, not the margin, makes it risky


def test_autograds_own_backward_is_no_hand_written_update() -> None:
    """A hand-written update after ``sqrt(w**2 + eps)``: the division inside the sqrt's backward
    (autograd's, grad mode off) is not the user's op and not a hazard."""
    torch.manual_seed(0)
    w = torch.randn(8, requires_grad=True)
    with nanguard.check(steps=3) as hz:
        for _ in range(10):
            torch.sqrt(w ** 2 + 1e-14).sum().backward()
            with torch.no_grad():
                assert w.grad is not None
                w -= 0.1 * w.grad
                w.grad = None
    assert hz.steps == 3
    assert [h.op for h in hz.hazards] == ["sqrt"] and _risky(hz.hazards) == []


def test_gradient_accumulation_counts_optimizer_steps_only() -> None:
    """4 backward passes per ``optimizer.step()``: the check's steps are the optimizer's."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    backwards = 0
    with nanguard.check(steps=2) as hz:
        for _ in range(10):
            for _ in range(4):
                model(torch.randn(8, 4)).pow(2).mean().backward()
                backwards += 1
            opt.step()
            opt.zero_grad()
    assert (hz.steps, backwards) == (2, 8)


@pytest.mark.parametrize("through", ["p", "p.data"])
def test_a_hand_written_update_through_data_and_a_momentum_buffer_keeps_its_newest_margin(through: str) -> None:
    """``p.data.sub_(...)`` writes the weight's storage as ``p.sub_`` does; the divisor's
    margin carried through a momentum buffer is the newest step's, not the first one's."""
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(6))
    buf = torch.zeros(6)
    scale = [1.0]
    with nanguard.check(steps=30) as hz:
        for _ in range(100):
            (w * torch.randn(6)).sum().backward()
            with torch.no_grad():
                assert w.grad is not None
                g = w.grad * scale[0]
                buf.mul_(0.9).add_(g / g.norm())  # normalised gradient descent
                (w if through == "p" else w.data).sub_(0.01 * buf)
                w.grad = None
            scale[0] *= 0.5  # the gradient's norm halves every step
    assert hz.steps == 30
    (h,) = [h for h in hz.hazards if h.op == "div"]
    assert h.pattern == "division by a norm that can be 0" and h.margin < 1e-6 and h.calls >= 25
