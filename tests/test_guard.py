"""attach(): watch every step, replay the failing one, raise or skip — on ordinary loops."""

from __future__ import annotations

import io
import math
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nanguard
from nanguard import Cause, NonFiniteError
from nanguard.demos import seed_torch


def _mlp(d: int = 8) -> nn.Module:
    return nn.Sequential(
        OrderedDict(fc1=nn.Linear(d, 16), relu=nn.ReLU(), drop=nn.Dropout(0.1), fc2=nn.Linear(16, 1))
    )


def _all_finite(model: nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def test_seed_scenario_is_caught_at_its_origin_before_the_update() -> None:
    with pytest.raises(NonFiniteError) as info:
        seed_torch.train(seed_torch.LR)
    f, d = info.value.finding, info.value.diagnosis
    assert (f.op, f.phase, f.module, f.module_type) == ("aten.addmm.default", "forward", "fc2", "Linear")
    assert f.detected_by == "replay" and f.reached == "loss"
    assert f.step is not None and 2 <= f.step <= 8
    assert "relu2" in f.details["relu_grad"]
    assert d is not None and d.cause is Cause.LEARNING_RATE_TOO_HIGH
    # measured (ratio ≈ 1.6, not ÷4) and verified on the failing step
    assert any("lr=0.04)  # was 4; verified on the failing step" in fix for fix in d.fixes), d.fixes
    assert "fc2" in str(info.value)


def test_seed_scenario_trains_with_a_sane_learning_rate() -> None:
    guard, losses = seed_torch.train(0.01, steps=50)
    assert guard.findings == [] and all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0]


def test_nan_sample_in_the_batch_is_reported_as_data() -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(32, 8)
    x[5, 3] = float("nan")
    y = torch.randn(32, 1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    with pytest.raises(NonFiniteError) as info, nanguard.attach(model, opt):
        for xb, yb in loader:
            opt.zero_grad()
            F.mse_loss(model(xb), yb).backward()
            opt.step()
    f = info.value.finding
    assert f.phase == "data" and f.step == 0
    assert f.details["samples"] == [{"index": 5, "kind": "NaN", "features": [3], "dataset_index": 5}]
    assert info.value.diagnosis.cause is Cause.NONFINITE_INPUT
    assert _all_finite(model)


def test_hand_written_loss_outside_any_module() -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.no_grad():
        model.fc2.bias.fill_(200.0)  # sigmoid saturates to exactly 1.0
    x, y = torch.randn(16, 8), torch.zeros(16, 1)
    with pytest.raises(NonFiniteError) as info, nanguard.attach(model, opt):
        opt.zero_grad()
        p = torch.sigmoid(model(x))
        loss = -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()  # log(sigmoid) BCE
        loss.backward()
        opt.step()
    f = info.value.finding
    assert (f.op, f.phase, f.module) == ("aten.log.default", "forward", None)
    assert "torch.log(1 - p)" in (f.source_code or "")
    d = info.value.diagnosis
    assert d.cause is Cause.UNSAFE_OP
    assert any("BCEWithLogitsLoss" in fix for fix in d.fixes)


def test_without_an_optimizer_backward_is_the_step_marker() -> None:
    class Norm(nn.Module):
        def forward(self, v: torch.Tensor) -> torch.Tensor:
            return torch.sqrt((v**2).sum(-1, keepdim=True))

    model = nn.Sequential(OrderedDict(fc=nn.Linear(4, 4), norm=Norm()))
    lr = 0.05
    x = torch.randn(8, 4)
    with pytest.raises(NonFiniteError) as info, nanguard.attach(model):
        for step in range(3):
            if step == 2:
                with torch.no_grad():
                    model.fc.weight.zero_()
                    model.fc.bias.zero_()
            model(x).sum().backward()
            with torch.no_grad():  # a classic hand-written update
                for p in model.parameters():
                    p -= lr * p.grad
                    p.grad = None
    f = info.value.finding
    assert (f.phase, f.grad_fn, f.module, f.step) == ("backward", "SqrtBackward0", "norm", 2)
    assert info.value.diagnosis.cause is Cause.UNSAFE_OP


def test_injected_nan_gradient_is_caught_before_the_update() -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(NonFiniteError) as info, nanguard.attach(model, opt):
        opt.zero_grad()
        F.mse_loss(model(torch.randn(4, 8)), torch.randn(4, 1)).backward()
        model.fc1.weight.grad[0, 0] = float("nan")
        opt.step()
    f = info.value.finding
    assert f.reached == "gradients"
    assert "fc1.weight" in str(f.details)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_skip_policy_counts_and_never_applies_a_bad_update() -> None:
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    data, y = torch.randn(6, 16, 8), torch.randn(16, 1)
    data[2:4, 0, 0] = float("inf")
    with nanguard.attach(model, opt, policy="skip", max_consecutive_skips=3) as guard:
        for step in range(6):
            xb = data[step]
            opt.zero_grad()
            F.mse_loss(model(xb), y).backward()
            opt.step()
            assert guard.step_was_skipped == (step in (2, 3))
            assert _all_finite(model)
            if step == 4:
                assert guard.notfinite_count == 0  # reset by a good step
    assert guard.total_notfinite == 2 and len(guard.findings) == 2
    assert all(f.phase == "data" for f, _ in guard.findings)


def test_skip_policy_gives_up_after_n_consecutive_skips() -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.full((4, 8), float("nan"))
    with pytest.raises(nanguard.GiveUpError) as info, nanguard.attach(
        model, opt, policy="skip", max_consecutive_skips=2
    ):
        for _ in range(5):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
    assert "2 consecutive" in str(info.value)


def _train(seed: int, guard: bool, policy: str = "raise") -> list[torch.Tensor]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, 3, 0.5)
    g = nanguard.attach(model, opt, policy=policy) if guard else None
    try:
        for _ in range(10):
            x = torch.randn(16, 8)
            opt.zero_grad(set_to_none=True)
            loss = F.smooth_l1_loss(model(x * 2.0), x[:, :1])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
    finally:
        if g is not None:
            g.detach()
    return [t.detach().clone() for t in [*model.parameters(), *model.buffers()]]


@pytest.mark.parametrize("policy", ["raise", "skip"])
def test_a_healthy_run_is_bit_for_bit_unchanged(policy: str) -> None:
    plain = _train(1, guard=False)
    guarded = _train(1, guard=True, policy=policy)
    assert all(torch.equal(a, b) for a, b in zip(plain, guarded))


def test_replay_leaves_no_trace() -> None:
    from nanguard.torch._modules import ModuleStack
    from nanguard.torch.guard import Guard
    from nanguard.torch.replay import replay

    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = Guard(model, opt).install()
    try:
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        buffers = [b.clone() for b in model.buffers()]
        rng = torch.get_rng_state()
        grads = [p.grad.clone() for p in model.parameters()]
        events = list(guard.recorder.events)
        finding, extra = replay(events, model=model, modules=ModuleStack(model), step=0)
    finally:
        guard.detach()
    assert finding is None and extra["complete"]
    assert all(torch.equal(a, b) for a, b in zip(buffers, model.buffers()))
    assert torch.equal(rng, torch.get_rng_state())
    assert all(torch.equal(a, p.grad) for a, p in zip(grads, model.parameters()))


def test_model_can_be_pickled_while_attached() -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with nanguard.attach(model, opt):
        model(torch.randn(2, 8)).sum().backward()
        buf = io.BytesIO()
        torch.save(model, buf)
        buf.seek(0)
        again = torch.load(buf, weights_only=False)
    assert isinstance(again, nn.Sequential)


def test_misuse_gets_clear_errors() -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match=r"attach\(model=...\) expects a torch.nn.Module"):
        nanguard.attach(opt)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"attach\(optimizer=...\)"):
        nanguard.attach(model, torch.optim.lr_scheduler.StepLR(opt, 1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="valid policies are raise, skip, recover"):
        nanguard.attach(model, opt, policy="ignore")
    g = nanguard.attach(model, opt)
    try:
        with pytest.raises(RuntimeError, match="already attached"):
            nanguard.attach(model, opt)
    finally:
        g.detach()
    g.detach()  # twice is fine
    nanguard.attach(model, opt).detach()  # and attaching again after detach works


def test_clip_grad_norm_swallowing_an_overflow_is_reported() -> None:
    """The total norm overflows, clip scales every gradient by 0: the returned inf is the trace."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    with pytest.raises(NonFiniteError) as info, nanguard.attach(model, opt):
        for step in range(3):
            opt.zero_grad()
            (F.mse_loss(model(x), y) * (1e25 if step == 2 else 1.0)).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
    f, d = info.value.finding, info.value.diagnosis
    assert f.step == 2 and f.op in ("aten._foreach_norm.Scalar", "aten.linalg_vector_norm.default")
    assert "clip_grad_norm_" in (f.reached or "") and d.cause is Cause.EXPLODING_GRADIENTS


def test_clip_with_infinite_max_norm_is_not_a_finding() -> None:
    """max_norm=inf makes a harmless transient +inf inside torch: never reported."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with nanguard.attach(model, opt) as guard:
        for _ in range(3):
            opt.zero_grad()
            F.mse_loss(model(torch.randn(8, 8)), torch.zeros(8, 1)).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
            opt.step()
    assert guard.findings == []
    with nanguard.locate(model):
        F.mse_loss(model(torch.randn(8, 8)), torch.zeros(8, 1)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
        opt.step()


def test_keyword_arguments_of_the_model_call_are_replayed() -> None:
    """model(**batch), as Hugging Face models are called: the replay needs those inputs too."""

    class KwModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 1)

        def forward(self, input_ids: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
            assert input_ids is not None
            return self.fc(input_ids) * scale

    model = KwModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 4)
    x[3, 1] = float("nan")
    with pytest.raises(NonFiniteError) as info, nanguard.attach(model, opt):
        opt.zero_grad()
        model(input_ids=x, scale=2.0).sum().backward()
        opt.step()
    f = info.value.finding
    assert f.detected_by == "replay" and f.phase == "data"
    assert f.details["samples"] == [{"index": 3, "kind": "NaN", "features": [1]}]


def test_nan_row_of_an_embedding_is_a_weight_not_data() -> None:
    model = nn.Sequential(OrderedDict(embed=nn.Embedding(20, 8), rnn=nn.Flatten(), head=nn.Linear(24, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.no_grad():
        model.embed.weight[7, 2] = float("nan")  # as loaded from a bad checkpoint
    tokens = torch.tensor([[1, 7, 3], [2, 4, 5]])
    with pytest.raises(NonFiniteError) as info, nanguard.attach(model, opt):
        opt.zero_grad()
        model(tokens).sum().backward()
        opt.step()
    f = info.value.finding
    assert f.op == "parameter" and f.module == "embed"
    assert info.value.diagnosis.cause is Cause.NONFINITE_PARAMETERS


def test_dataclass_output_of_the_model_is_replayed() -> None:
    from dataclasses import dataclass

    @dataclass
    class Out:
        loss: torch.Tensor
        logits: torch.Tensor

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> Out:
            logits = self.fc(x)
            per_item = logits.pow(2).sum(-1) * mask
            return Out(loss=per_item.sum() / mask.sum(), logits=logits)  # mask.sum() can be 0

    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(NonFiniteError) as info, nanguard.attach(model, opt):
        opt.zero_grad()
        model(torch.randn(5, 4), mask=torch.zeros(5)).loss.backward()
        opt.step()
    f = info.value.finding
    assert (f.op, f.phase, f.module) == ("aten.div.Tensor", "forward", "")
    assert info.value.diagnosis.cause is Cause.UNSAFE_OP


def test_hand_written_update_without_an_optimizer_learning_rate_too_high() -> None:
    torch.manual_seed(0)
    x = torch.rand(64, 2) * 30
    y = x @ torch.tensor([[0.8], [3.0]])
    w = torch.randn(2, 8, requires_grad=True)
    v = torch.randn(8, 1, requires_grad=True)
    with pytest.raises(NonFiniteError) as info, nanguard.attach():
        for _ in range(50):
            loss = ((x @ w @ v - y) ** 2).mean()
            loss.backward()
            with torch.no_grad():
                for p in (w, v):
                    p.data -= 3e-3 * p.grad  # far too large for unscaled inputs
                    p.grad.zero_()
    f, d = info.value.finding, info.value.diagnosis
    # whichever op overflows first as the weights grow (the mean of the squared errors here)
    assert f.phase == "forward" and f.op in ("aten.mm.default", "aten.pow.Tensor_Scalar", "aten.mean.default")
    assert d.cause is Cause.LEARNING_RATE_TOO_HIGH
    assert torch.isfinite(w).all()  # the replay never wrote into the real weights


def test_softmax_of_a_row_masked_entirely_is_the_origin_not_the_mask() -> None:
    class Attn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qk = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
            t = x.shape[1]
            s = self.qk(x) @ x.transpose(1, 2)
            s = s.masked_fill(torch.ones(t, t).triu(1).bool(), float("-inf"))  # causal
            s = s.masked_fill(pad[:, None, :], float("-inf"))  # padding, masks row 0 entirely
            return torch.softmax(s, -1) @ x

    model = Attn()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    pad = torch.tensor([[True, False, False, False]])
    with pytest.raises(NonFiniteError) as info, nanguard.attach(model, opt):
        opt.zero_grad()
        model(torch.randn(1, 4, 8), pad).sum().backward()
        opt.step()
    f, d = info.value.finding, info.value.diagnosis
    assert f.op == "aten._softmax.default" and f.details["from_masked_inf"]["op"] == "aten.masked_fill.Scalar"
    assert d.cause is Cause.UNSAFE_OP and "finfo" in d.fixes[0]


def test_accumulation_before_the_first_optimizer_step_counts_one_step() -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with nanguard.attach(model, opt) as guard:
        for _ in range(3):
            for _ in range(4):
                F.mse_loss(model(torch.randn(4, 8)), torch.zeros(4, 1)).div(4).backward()
            opt.step()
            opt.zero_grad()
    assert guard.step == 3 and len(guard.history) == 3
    assert all(r.loss is not None and r.lr == 0.01 for r in guard.history)


def test_replay_reenters_the_autocast_region_the_forward_ran_in() -> None:
    # the pattern PyTorch recommends: forward under autocast, backward() outside it. Prices in
    # dollars: the float16 weight gradient of the head overflows; in float32 it would not
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(body=nn.Sequential(nn.Linear(10, 64), nn.SiLU()), head=nn.Linear(64, 1)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x = torch.randn(64, 10)
    price = (3.0e5 + 1.0e5 * x[:, :1]).clamp(min=5e4)
    with pytest.raises(NonFiniteError) as info, nanguard.attach(model, opt):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x).float(), price)
        opt.zero_grad()
        loss.backward()
        opt.step()
    f, d = info.value.finding, info.value.diagnosis
    assert (f.op, f.phase, f.module, f.grad_fn, f.dtype) == (
        "aten.mm.default", "backward", "head", "AddmmBackward0", "float16")
    assert f.detected_by == "replay" and f.details["float32_finite"] is True
    assert d is not None and d.cause is Cause.LOW_PRECISION_OVERFLOW
    assert not torch.is_autocast_enabled("cpu")  # the replay left no autocast region behind


def test_a_learning_rate_schedule_gets_its_own_fix() -> None:
    # OneCycleLR with a max_lr far too high: the fix is the schedule's peak, not a new optimizer
    torch.manual_seed(0)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=20.0, total_steps=100)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    with pytest.raises(NonFiniteError) as info, nanguard.attach(model, opt) as guard:
        for _ in range(100):
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
            sched.step()
    d = info.value.diagnosis
    assert d is not None and d.cause is Cause.LEARNING_RATE_TOO_HIGH
    assert d.fixes[0].startswith("lower the peak of your `OneCycleLR`: max_lr=")
    reached = float(d.fixes[0].rsplit("it reached ", 1)[1].split(")")[0])
    assert reached == pytest.approx(opt.param_groups[0]["lr"], rel=1e-2)  # the schedule's value at the failure
    assert all(r.lr is None or r.lr <= reached * 1.01 for r in guard.history)


def test_with_two_optimizers_the_failing_ones_hyperparameters_are_diagnosed() -> None:
    # a GAN-like loop under `nanguard run` (no optimizer named): A is stepped first (the guard's
    # primary), B has the learning rate too high and fails at its own step
    torch.manual_seed(0)
    a, b = _mlp(), _mlp()
    opt_a = torch.optim.Adam(a.parameters(), lr=1e-4)
    opt_b = torch.optim.SGD(b.parameters(), lr=10.0)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    with pytest.raises(NonFiniteError) as info, nanguard.attach(a):
        for _ in range(50):
            opt_a.zero_grad()
            F.mse_loss(a(x), y).backward()
            opt_a.step()
            opt_b.zero_grad()
            F.mse_loss(b(x), y).backward()
            opt_b.step()
    d = info.value.diagnosis
    assert d is not None
    assert any("torch.optim.SGD(" in fix and "was 10" in fix for fix in d.fixes), d.fixes
    assert not any("Adam" in fix for fix in d.fixes)


def test_unscaled_targets_are_named_when_the_learning_rate_blows_up() -> None:
    torch.manual_seed(0)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(64, 8)
    price = 3e5 + 1e5 * x[:, :1]  # dollars, never scaled
    with pytest.raises(NonFiniteError) as info, nanguard.attach(model, opt):
        for _ in range(50):
            opt.zero_grad()
            F.mse_loss(model(x), price).backward()
            opt.step()
    d = info.value.diagnosis
    assert d is not None and d.cause is Cause.UNSCALED_DATA  # the root, not the learning rate
    assert d.fixes[0].startswith("y = (y - y.mean()) / y.std()")  # the inputs are standard normal
    assert not any("mean, std = x.mean(0)" in f for f in d.fixes)
    assert any(e.startswith("the mse_loss was already 1.23e+11 at step 0") and "targets up to 7.1e+05" in e
               for e in d.evidence), d.evidence


def test_a_model_built_after_attaching_does_not_crowd_the_first_step_out_of_the_tape() -> None:
    # as under `nanguard run`: the guard is on before the model is built, so step 0's tape
    # starts with the model's initialisation — here 300 orthogonal_ inits, thousands of ops
    with nanguard.attach() as guard:
        torch.manual_seed(0)
        layers: list[nn.Module] = []
        for _ in range(300):
            lin = nn.Linear(8, 8)
            nn.init.orthogonal_(lin.weight)
            layers += [lin, nn.Tanh()]
        model = nn.Sequential(*layers)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(16, 8)
        x[3, 5] = float("nan")
        with pytest.raises(NonFiniteError) as info:
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
    f = info.value.finding
    assert (f.phase, f.op, f.detected_by) == ("data", "input", "replay")
    assert f.details["samples"][0]["index"] == 3 and not guard.recorder.truncated


def test_a_functional_loss_is_one_tape_event_and_its_op_is_found_at_the_callers_line() -> None:
    # F.mse_loss called in the loop (looked up while attached) is recorded as one call, not as
    # its aten ops; the replay still finds the op inside it that overflowed, at the user's line
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.no_grad():
        model.fc2.bias.fill_(1e30)  # finite outputs whose square overflows float32
    x, y = torch.randn(16, 8), torch.zeros(16, 1)
    with pytest.raises(NonFiniteError) as info, nanguard.attach(model, opt) as guard:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)  # the line the finding names
        events = list(guard.recorder.events)
        loss.backward()
        opt.step()
    calls = [e for e in events if getattr(e, "func", None) is not None]
    assert [getattr(e.func, "__name__", "") for e in calls] == ["mse_loss"]
    assert not any(str(e.func).startswith("aten.mse_loss") for e in calls)
    f = info.value.finding
    assert (f.op, f.phase, f.module, f.detected_by) == ("aten.mse_loss.default", "forward", None, "replay")
    assert "F.mse_loss(model(x), y)" in (f.source_code or "")
    assert F.mse_loss.__name__ == "mse_loss" and not hasattr(F.mse_loss, "__wrapped__")  # put back


def test_a_functional_loss_bound_before_attaching_is_taped_op_by_op() -> None:
    loss_fn = F.mse_loss  # bound before the guard patched torch.nn.functional
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.no_grad():
        model.fc2.bias.fill_(1e30)
    x, y = torch.randn(16, 8), torch.zeros(16, 1)
    with pytest.raises(NonFiniteError) as info, nanguard.attach(model, opt) as guard:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        ops = [str(getattr(e, "func", "")) for e in guard.recorder.events]
        loss.backward()
        opt.step()
    assert "aten.mse_loss.default" in ops
    f = info.value.finding
    assert (f.op, f.phase, f.module) == ("aten.mse_loss.default", "forward", None)
    assert "loss_fn(model(x), y)" in (f.source_code or "")


def test_the_optimizers_profiler_region_does_not_pass_through_the_tape(monkeypatch: pytest.MonkeyPatch) -> None:
    # optimizer.step() opens a record_function before its hooks run and closes it after them:
    # its two profiler ops are not sent through the tape's mode, and the tape is on again after
    from nanguard.torch import _recorder

    seen: list[str] = []
    orig = _recorder._Tape.__torch_dispatch__

    def spy(self: object, func: object, types: object, args: object = (), kwargs: object = None) -> object:
        seen.append(str(func))
        return orig(self, func, types, args, kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_recorder._Tape, "__torch_dispatch__", spy)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 8), torch.zeros(16, 1)
    with nanguard.attach(model, opt) as guard:
        for _ in range(3):
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
            assert guard.recorder.tape_is_on
        with torch.autograd.profiler.record_function("user region"):
            z = x * 2  # a user's own profiled region: its ops are still taped
        assert guard.recorder.tape_is_on
    assert not any("profiler" in s for s in seen)
    assert "aten.mul.Tensor" in seen and z.shape == x.shape


def test_torchscript_compiles_a_wrapped_functional_loss_while_attached() -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with nanguard.attach(model, opt):
        scripted = torch.jit.script(nn.MSELoss())
        value = scripted(torch.ones(3), torch.zeros(3))
    assert float(value) == 1.0


class _Flaky(nn.Module):
    """A layer whose third call returns one NaN: a transient fault, not a property of its inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 1)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        y = self.fc(x)
        if self.calls == 3:
            y = y.clone()
            y[0, 0] = float("nan")
        return y


def test_a_step_that_is_finite_when_re_run_is_said_not_to_reproduce() -> None:
    torch.manual_seed(0)
    model = _Flaky()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(NonFiniteError) as info, nanguard.attach(model, opt):
        for _ in range(5):
            opt.zero_grad()
            F.mse_loss(model(torch.randn(16, 8)), torch.zeros(16, 1)).backward()
            opt.step()
    f = info.value.finding
    assert f.step == 2 and f.detected_by == "watch" and model.calls > 3  # re-run after the failure
    assert f.details["reproduced"] is False
    assert f.details["note"].startswith("did not reproduce: the step re-run on the same batch and the same "
                                        "weights gave a finite loss ("), f.details["note"]
