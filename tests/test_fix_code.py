"""Suggested code is code: the optimizer line a finding suggests keeps the script's own other
arguments (momentum, weight decay, betas), taken from the live optimizer, and compiles."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nanguard
from nanguard import Cause, NonFiniteError


def _code_lines(fixes: list[str]) -> list[str]:
    """The fixes written as Python (an assignment or a call of torch's), not advice in words."""
    return [f for f in fixes if f.startswith(("optimizer =", "opt =", "scheduler =", "torch.", "y = "))]


def test_a_learning_rate_fix_keeps_momentum_and_weight_decay_and_compiles() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=5.0, momentum=0.9, weight_decay=1e-4)
    x, y = torch.randn(64, 8), torch.randn(64, 1) * 3
    with pytest.raises(NonFiniteError) as info, nanguard.attach(model, opt):
        for _ in range(50):
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
    d = info.value.diagnosis
    assert d is not None and d.cause is Cause.LEARNING_RATE_TOO_HIGH
    first = d.fixes[0]
    assert first.startswith("opt = torch.optim.SGD(model.parameters(), lr=")  # the script's names
    assert first.split("  #")[0].endswith(", momentum=0.9, weight_decay=0.0001)"), first
    for line in _code_lines(d.fixes):
        compile(line, "<fix>", "exec")


def test_an_optimizer_with_its_defaults_is_suggested_as_it_was_written() -> None:
    from nanguard.torch._port import kept_args

    m = nn.Linear(2, 2)
    assert kept_args(torch.optim.Adam(m.parameters(), lr=1e-3)) == {}
    assert kept_args(torch.optim.AdamW(m.parameters(), lr=1.0, betas=(0.9, 0.95))) == {"betas": (0.9, 0.95)}
    assert kept_args(torch.optim.RMSprop(m.parameters(), lr=0.1, eps=0.0)) == {"eps": 0.0}


def test_every_optimizer_line_of_the_phrasebooks_compiles() -> None:
    from nanguard.core.phrases import KERAS, TORCH

    kw = {"optvar": "opt", "params": "net.parameters()", "opt": "SGD", "lr": "0.001", "kept": ", momentum=0.9", "was": "  # was 0.1", "clip": "3",
          "sched": "StepLR", "peak": "0.01", "top": "0.1"}
    for book in (TORCH, KERAS):
        lr = book.lr
        lines = [lr.new_lr, lr.eps_fix, *lr.lr_fixes, *lr.explode_fixes,
                 *(lr.lr_fixes_scheduled or ()), *(lr.lr_fixes_cyclic or ()), *(lr.lr_fixes_varying or ())]
        for template in lines:
            text = template.format(**kw)
            if text.startswith(("opt =", "scheduler =", "torch.", "peak_lr")):
                compile(text.replace("...", "None"), "<fix>", "exec")


def test_a_keras_optimizer_line_keeps_its_own_arguments() -> None:
    keras = pytest.importorskip("keras")
    from nanguard.keras._context import kept_args

    assert kept_args(keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)) == {"momentum": 0.9}
    assert kept_args(keras.optimizers.Adam(learning_rate=0.1)) == {}


def _diverge(opt: torch.optim.Optimizer, loss: Any) -> Any:
    with pytest.raises(NonFiniteError) as info, nanguard.attach(optimizer=opt):
        for _ in range(60):
            opt.zero_grad()
            loss().backward()
            opt.step()
    return info.value.diagnosis


def test_a_fix_names_the_scripts_own_optimizer_and_model() -> None:
    """``opt`` and ``net`` in the script: the suggested lines say ``opt = …(net.parameters(), …)``
    and clip ``net.parameters()``, and compile."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(net.parameters(), lr=5.0, momentum=0.9)
    x, y = torch.randn(64, 8), torch.randn(64, 1) * 3
    d = _diverge(opt, lambda: F.mse_loss(net(x), y))
    assert d is not None and d.cause is Cause.LEARNING_RATE_TOO_HIGH
    assert d.fixes[0].startswith("opt = torch.optim.SGD(net.parameters(), lr="), d.fixes
    assert any(f.startswith("torch.nn.utils.clip_grad_norm_(net.parameters(),") for f in d.fixes), d.fixes
    for line in _code_lines(d.fixes):
        compile(line, "<fix>", "exec")


class _ActorCritic:
    """Two optimizers on two modules, kept as attributes (SAC/TD3-like)."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.actor, self.critic = nn.Linear(4, 2), nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=1e-3)
        self.critic_opt = torch.optim.SGD(self.critic.parameters(), lr=8.0)

    def train(self) -> Any:
        s, q = torch.randn(32, 4), torch.randn(32, 1) * 10
        return _diverge(self.critic_opt, lambda: F.mse_loss(self.critic(torch.cat([s, self.actor(s)], 1)), q))


def test_with_two_optimizers_the_fix_names_the_one_that_failed_and_its_module() -> None:
    d = _ActorCritic().train()
    assert d is not None
    line = next(f for f in d.fixes if "torch.optim." in f)
    assert line.startswith("self.critic_opt = torch.optim.SGD(self.critic.parameters(), lr="), d.fixes


def test_names_not_found_keep_the_generic_words() -> None:
    from nanguard.torch._script_names import script_names

    m = nn.Linear(2, 2)
    assert script_names(torch.optim.SGD([*m.parameters()][:1], lr=0.1)) == {}  # a bare temporary
    kept = torch.optim.SGD(m.parameters(), lr=0.1)
    assert script_names(kept) == {"optimizer": "kept", "params": "m.parameters()"}


def test_a_learning_rate_from_a_command_line_flag_is_changed_there(monkeypatch: pytest.MonkeyPatch) -> None:
    """``train.py --lr 5``: the fix is the flag, as the user set it, not an optimizer line the
    flag feeds; a flag with another value is not taken for it."""
    from nanguard.core.flags import Flag, lr_flag, wd_flag

    assert lr_flag(5.0, ["--lr=5"]) == Flag("--lr", "5", "=")
    assert lr_flag(5.0, ["--base-learning-rate", "5.0"]) == Flag("--base-learning-rate", "5.0", " ")
    assert lr_flag(5.0, ["--layers", "5", "--lr", "0.1"]) is None
    # minGPT's parser takes only --arg=value: the advice keeps the form the user typed
    assert lr_flag(50.0, ["--trainer.learning_rate=5e1"]).typed("0.0007") == "--trainer.learning_rate=0.0007"
    # a schedule moved the learning rate (warmup at 6.2 of 10): the flag at or above its peak
    assert lr_flag(6.2, ["--learning_rate=10.0", "--min_lr=1e-5", "--lr_decay_iters=500"], top=6.2) == Flag(
        "--learning_rate", "10.0", "=")
    assert wd_flag(1e4, ["--weight-decay", "1e4"]) == Flag("--weight-decay", "1e4", " ")
    assert wd_flag(1e4, ["--trainer.weight_decay=1e4"]) == Flag("--trainer.weight_decay", "1e4", "=")
    assert wd_flag(0.1, ["--wd", "0.2"]) is None
    monkeypatch.setattr("sys.argv", ["train.py", "--epochs", "3", "--lr", "5"])
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(net.parameters(), lr=5.0)
    x, y = torch.randn(64, 8), torch.randn(64, 1) * 3
    d = _diverge(opt, lambda: F.mse_loss(net(x), y))
    assert d is not None and d.cause is Cause.LEARNING_RATE_TOO_HIGH
    assert d.fixes[0].startswith("run it again with `--lr "), d.fixes
    assert "(it was `--lr 5`): your learning rate comes from the command line (verified on the failing step: " \
        "loss " in d.fixes[0], d.fixes[0]


def test_a_flag_a_schedule_scales_is_changed_there_by_the_same_factor(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--learning_rate=10`` under a warmup the script writes into ``param_group["lr"]`` every
    step (nanoGPT's way, PPO's annealing): a new optimizer line would be overwritten at the next
    step — the fix is the flag, in the user's form, scaled by the factor the suggestion applies."""
    monkeypatch.setattr("sys.argv", ["train.py", "--learning_rate=10.0"])
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(net.parameters(), lr=10.0)
    x, y = torch.randn(64, 8), torch.randn(64, 1) * 3
    with pytest.raises(NonFiniteError) as info, nanguard.attach(optimizer=opt):
        for it in range(60):
            for g in opt.param_groups:
                g["lr"] = 10.0 * min(1.0, (it + 1) / 20)  # linear warmup from the flag
            opt.zero_grad()
            F.mse_loss(net(x), y).backward()
            opt.step()
    d = info.value.diagnosis
    assert d is not None and d.cause is Cause.LEARNING_RATE_TOO_HIGH
    first = d.fixes[0]
    assert first.startswith("run it again with `--learning_rate="), d.fixes
    assert "(it was `--learning_rate=10.0`): your learning rate comes from the command line (your schedule scales it" \
        in first, first
    new = float(first.split("`--learning_rate=")[1].split("`")[0])
    assert new < 0.5  # far below the flag's 10


def test_a_weight_decay_from_a_flag_is_changed_there(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--weight-decay 1e4`` with AdamW at lr 5e-4 (makemore's flags): the decay, not the
    learning rate, is what is off — and it came from the command line."""
    monkeypatch.setattr("sys.argv", ["makemore.py", "--weight-decay", "1e4"])
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.AdamW(net.parameters(), lr=5e-4, weight_decay=1e4)
    x, y = torch.randn(64, 8), torch.randn(64, 1) * 3
    d = _diverge(opt, lambda: F.mse_loss(net(x), y).log())  # log: the zeroed weights' 0 loss is the NaN
    assert d is not None and d.rule == "decay_too_strong", (d.rule, d.fixes)
    assert d.fixes[0].startswith(
        "run it again with `--weight-decay 0.2` (it was `--weight-decay 1e4`): your weight decay comes from the "
        "command line, and is too strong for this learning rate (verified on the failing step: loss "), d.fixes


class _Unreadable:
    """A ``self`` whose attributes cannot be listed (a proxy, a C extension)."""

    @property
    def __dict__(self) -> dict[str, Any]:  # type: ignore[override]
        raise RuntimeError("no attributes here")

    def names_of(self, opt: torch.optim.Optimizer) -> dict[str, str]:
        from nanguard.torch._script_names import script_names

        return script_names(opt)


def test_a_frame_nanguard_cannot_read_leaves_the_generic_words_not_an_error() -> None:
    m = nn.Linear(2, 2)
    assert _Unreadable().names_of(torch.optim.SGD(m.parameters(), lr=0.1)) == {}
