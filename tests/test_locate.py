"""The locator names the op that made the first non-finite value: exact op, phase and module."""

from __future__ import annotations

import warnings
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nanguard
from nanguard import NonFiniteError


@pytest.fixture(autouse=True, params=["sync", "deferred"])
def _check_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every locator test runs twice: checks read one by one, and deferred (the flags stay on the
    device for a window of ops, as on a GPU)."""
    monkeypatch.setenv("NANGUARD_DEFERRED", "1" if request.param == "deferred" else "0")


def _find(fn) -> nanguard.Finding:
    with pytest.raises(NonFiniteError) as info:
        fn()
    return info.value.finding


class LogSoftmaxByHand(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = F.softmax(self.proj(x) * 1000.0, dim=-1)  # underflows to exact zeros
        return torch.log(p)


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        self.head = LogSoftmaxByHand()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def test_log_of_underflowed_softmax_is_found_in_forward() -> None:
    model = Classifier()
    x, y = torch.randn(16, 8), torch.randint(0, 5, (16,))

    def step() -> None:
        with nanguard.locate(model):
            logp = model(x)
            loss = -(F.one_hot(y, 5) * logp).sum()
            loss.backward()

    f = _find(step)
    assert (f.op, f.phase, f.module, f.module_type) == ("aten.log.default", "forward", "head", "LogSoftmaxByHand")
    assert f.reached == "loss"
    assert f.neginf > 0 and f.inputs[0].zeros > 0
    assert f.source is not None and f.source.startswith("tests/test_locate.py:")
    assert "torch.log(p)" in (f.source_code or "")
    assert "aten._softmax.default" in f.details["input_producers"]


def test_detect_anomaly_blames_a_backward_node_for_the_same_bug() -> None:
    """The contrast the locator exists for: anomaly mode names a backward node, not the log."""
    model = Classifier()
    x, y = torch.randn(16, 8), torch.randint(0, 5, (16,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autograd.detect_anomaly(), pytest.raises(RuntimeError) as info:
            (-(F.one_hot(y, 5) * model(x)).sum()).backward()
    assert "Backward0" in str(info.value)


class SafeNorm(nn.Module):
    """sqrt of a sum of squares: finite forward at 0, infinite backward."""

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        return torch.sqrt((v**2).sum(-1))


def test_sqrt_of_zero_is_found_in_backward() -> None:
    model = nn.Sequential(OrderedDict(proj=nn.Linear(3, 3), norm=SafeNorm()))
    with torch.no_grad():
        model.proj.weight.zero_()
        model.proj.bias.zero_()

    def step() -> None:
        with nanguard.locate(model):
            model(torch.randn(4, 3)).sum().backward()

    f = _find(step)
    assert (f.phase, f.grad_fn, f.module) == ("backward", "SqrtBackward0", "norm")
    assert f.op == "aten.div.Tensor"
    assert f.reached == "gradients"
    assert f.posinf > 0
    assert "torch.sqrt" in (f.source_code or "")  # the forward line that made the node


def test_division_by_zero_std_is_found() -> None:
    class Standardize(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x - x.mean(0)) / x.std(0)

    model = nn.Sequential(OrderedDict(norm=Standardize(), fc=nn.Linear(4, 1)))
    x = torch.ones(8, 4)  # constant features: std 0, x - mean 0

    def step() -> None:
        with nanguard.locate(model):
            model(x).mean().backward()

    f = _find(step)
    assert (f.op, f.phase, f.module) == ("aten.div.Tensor", "forward", "norm")
    assert f.nan == 32
    assert f.inputs[1].zeros == 4


def _relu_net() -> nn.Module:
    return nn.Sequential(
        OrderedDict(
            fc1=nn.Linear(4, 16), relu1=nn.ReLU(), fc2=nn.Linear(16, 16), relu2=nn.ReLU(),
            head=nn.Linear(16, 1),
        )
    )


def test_linear_overflow_after_weights_blew_up() -> None:
    model = _relu_net()
    with torch.no_grad():
        model.fc1.weight.abs_()
        model.fc2.weight.fill_(1e37)  # as after a few steps with a learning rate far too high

    def step() -> None:
        with nanguard.locate(model):
            model(torch.rand(8, 4) * 100).mean().backward()

    f = _find(step)
    assert (f.op, f.phase, f.module, f.module_type) == ("aten.addmm.default", "forward", "fc2", "Linear")
    assert f.posinf + f.neginf > 0
    assert "relu2" in f.details["relu_grad"]  # where TF's old ReluGrad check would have fired


def test_backward_overflow_reaching_relu_grad_names_the_matmul_not_threshold_backward() -> None:
    model = _relu_net()
    with torch.no_grad():
        for m in (model.fc1, model.fc2, model.head):
            m.weight.abs_()
            m.bias.zero_()
        model.head.weight.fill_(1e10)
    x = torch.rand(8, 4) * 1e-12  # a finite forward pass: the output stays small

    def step() -> None:
        with nanguard.locate(model):
            (model(x) * 1e30).sum().backward()  # d loss / d relu2 = 1e30 * 1e10: overflows

    f = _find(step)
    assert (f.phase, f.op, f.grad_fn, f.module) == ("backward", "aten.mm.default", "AddmmBackward0", "head")
    assert f.reached == "gradients"


def test_float16_matmul_overflow() -> None:
    model = nn.Sequential(OrderedDict(fc=nn.Linear(64, 64).half()))
    x = (torch.rand(4, 64) * 60).half()
    with torch.no_grad():
        model.fc.weight.fill_(40.0)

    def step() -> None:
        with nanguard.locate(model):
            model(x).float().sum().backward()

    f = _find(step)
    assert f.op == "aten.addmm.default" and f.phase == "forward" and f.module == "fc"
    assert f.dtype == "float16" and f.posinf > 0
    assert f.details["float32_finite"] is True
    d = nanguard.diagnose(f)
    assert d.cause is nanguard.Cause.LOW_PRECISION_OVERFLOW


def test_nonfinite_input_is_reported_as_data() -> None:
    model = _relu_net()
    x = torch.randn(10, 4)
    x[7, 2] = float("nan")

    def step() -> None:
        with nanguard.locate(model):
            model(x).mean().backward()

    f = _find(step)
    assert f.phase == "data" and f.op == "input"
    assert f.details["samples"] == [{"index": 7, "kind": "NaN", "features": [2]}]
    assert nanguard.diagnose(f).cause is nanguard.Cause.NONFINITE_INPUT


def test_already_nonfinite_weights_are_reported_as_parameters() -> None:
    model = _relu_net()
    with torch.no_grad():
        model.fc2.weight[0, 0] = float("inf")

    def step() -> None:
        with nanguard.locate(model):
            model(torch.randn(4, 4)).mean().backward()

    f = _find(step)
    assert f.op == "parameter" and f.details["parameters"] == ["fc2.weight"]
    assert nanguard.diagnose(f).cause is nanguard.Cause.NONFINITE_PARAMETERS


def test_adam_eps_zero_is_found_in_the_optimizer() -> None:
    model = nn.Sequential(OrderedDict(fc=nn.Linear(4, 2)))
    opt = torch.optim.Adam(model.parameters(), eps=0.0)
    x = torch.randn(5, 4)
    x[:, 0] = 0  # the gradient of fc.weight[:, 0] is exactly 0: Adam's update is 0/0

    def step() -> None:
        with nanguard.locate(model):
            model(x).sum().backward()
            opt.step()

    f = _find(step)
    assert f.phase == "optimizer"
    assert f.op in ("aten.addcdiv_.default", "aten._foreach_addcdiv_.ScalarList", "aten.div.Tensor")
    assert f.details["parameters"] == ["fc.weight"]
    ctx = nanguard.core.RunContext(optimizer="Adam", hyper={"lr": 1e-3, "eps": 0.0})
    assert nanguard.diagnose(f, context=ctx).cause is nanguard.Cause.OPTIMIZER_STATE


def test_a_nonfinite_value_that_reaches_nothing_is_not_a_finding() -> None:
    with nanguard.locate() as loc:
        mask = torch.log(torch.tril(torch.ones(4, 4)))  # a deliberate log(0), never trained on
    assert loc.findings == [] and torch.isinf(mask).any()


# --- healthy models: no finding at all -------------------------------------------------------


class MaskedAttention(nn.Module):
    def __init__(self, d: int = 16, t: int = 6) -> None:
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        # both idioms of real scripts: a deliberate log(0) and a masked_fill with -inf
        self.register_buffer("log_mask", torch.log(torch.tril(torch.ones(t, t))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        att = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        t = x.shape[1]
        att = att + self.log_mask[:t, :t]
        att = att.masked_fill(torch.ones(t, t).triu(1).bool(), float("-inf"))
        return F.softmax(att, dim=-1) @ v


def test_healthy_models_produce_no_finding() -> None:
    torch.manual_seed(0)
    with nanguard.locate():
        causal_log = torch.log(torch.tril(torch.ones(6, 6)))  # made inside: -inf, then absorbed
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 2)
    att = MaskedAttention()
    conv = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Dropout(0.2))
    lstm = nn.LSTM(4, 8, batch_first=True)
    params = [*enc.parameters(), *att.parameters(), *conv.parameters(), *lstm.parameters()]
    opt = torch.optim.Adam(params, lr=1e-3)
    x = torch.randn(2, 6, 16)
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    causal = nn.Transformer.generate_square_subsequent_mask(6)
    with nanguard.locate() as loc:
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            out = enc(x, mask=causal, src_key_padding_mask=pad).sum()
            out = out + att(x).sum() + (x[:, :, :6] + causal_log).softmax(-1).sum()
            h = conv(torch.randn(2, 3, 8, 8)).mean((2, 3))
            o, _ = lstm(h.unsqueeze(1).repeat(1, 5, 1))
            (out + o.sum()).backward()
            opt.step()
    assert loc.findings == []


def test_odd_tensors_and_outputs_do_not_crash_or_report() -> None:
    class Odd(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.frozen = nn.Linear(4, 4).requires_grad_(False)
            self.unused = nn.Linear(4, 4)  # its grad stays None

        def forward(self, x: torch.Tensor) -> dict[str, object]:
            ints = torch.arange(6).reshape(2, 3) * 2
            comp = torch.randn(3, dtype=torch.complex64) * 2
            sparse = torch.eye(3).to_sparse() * 2
            meta = torch.empty(3, device="meta") + 1
            empty = torch.empty(0, 4) @ torch.empty(4, 2)
            return {"out": (self.frozen(self.fc(x)), ints), "extra": [comp, sparse, meta, empty]}

    model = Odd()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with nanguard.locate(model) as loc:
        res = model(torch.randn(2, 4))
        res["out"][0].sum().backward()
        opt.step()
    assert loc.findings == []


class SqrtReLU(torch.autograd.Function):
    """A hand-written activation whose backward forgets that its output can be 0."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        out = torch.sqrt(torch.clamp(x, min=0))
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        (out,) = ctx.saved_tensors
        return grad_out * 0.5 / out  # the line to fix: x/0 where the unit is off


class SqrtAct(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return SqrtReLU.apply(x)


def _custom_fn_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(OrderedDict(fc=nn.Linear(8, 16), act=SqrtAct(), head=nn.Linear(16, 1)))


def _backward_line() -> int:
    import inspect

    src, start = inspect.getsourcelines(SqrtReLU.backward)
    return start + next(i for i, line in enumerate(src) if "grad_out * 0.5 / out" in line)


def test_custom_autograd_function_backward_is_named_with_its_line_and_module() -> None:
    model = _custom_fn_net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(32, 8)

    def step() -> None:
        with nanguard.attach(model, opt):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()

    with pytest.raises(NonFiniteError) as info:
        step()
    f, d = info.value.finding, info.value.diagnosis
    assert (f.op, f.phase, f.module, f.grad_fn) == ("aten.div.Tensor", "backward", "act", "SqrtReLUBackward")
    assert f.details["custom_function"] == "SqrtReLU"
    assert f.source is not None and f.source.endswith(f"test_locate.py:{_backward_line()}")
    # the hand-written backward is judged as written: a division by zero, not an overflow
    assert d is not None and d.cause is nanguard.Cause.UNSAFE_OP and "division by zero" in d.summary
    assert "(the hand-written backward of your autograd.Function `SqrtReLU`" in str(info.value)


def test_custom_autograd_function_backward_under_locate() -> None:
    model = _custom_fn_net()

    def run() -> None:
        with nanguard.locate(model):
            model(torch.randn(32, 8)).sum().backward()

    f = _find(run)
    assert (f.op, f.phase, f.module, f.grad_fn) == ("aten.div.Tensor", "backward", "act", "SqrtReLUBackward")
    assert f.source is not None and f.source.endswith(f":{_backward_line()}")
