"""Overhead of nanguard on healthy training steps, against detect_anomaly (and sherlorch).

Usage::

    python benchmarks/overhead.py                 # full table (a few minutes on 2 CPU cores)
    python benchmarks/overhead.py --quick         # CI smoke run: tiny sizes, 3 repeats
    python benchmarks/overhead.py --device cuda   # on a GPU (see benchmarks/gpu_check.sh)

For each model and size, the variants run round-robin (A B C A B C …, so drift of the machine
cancels out), each running a block of training steps timed one by one; the table gives the median
step time of each variant (over all its blocks) as a ratio to plain training. Timing is never asserted anywhere: this prints numbers.

Fairness: nanguard's hooks are global, so a plain step timed while a guard is attached is slowed
too. Every variant is attached only for its own block, and before each plain or floor block
``assert_detached`` checks that nothing is left installed. ``floor`` is what any finiteness check
pays at least (one ``torch._foreach_norm`` over the gradients, stacked with the loss, one host
read: what ``GradScaler`` pays). The RL rows time one REINFORCE update of a 2-layer policy with
200 environment steps: each a ``no_grad`` forward, or (as pytorch/examples' ``reinforce.py``
writes it) a forward with grad whose log-prob the update uses. The tiny loop's row times whole
runs (30,000 steps by default, ``--tiny-steps``) of a logistic regression with a hand-written
update and no module (``TinyLogReg``, as GRIST's numerical-bug programs are written), each
variant attached once per run, so its one-time and later looks are in the time; ``trace`` is
left out of that row (a trace of every op of 30,000 steps is not a way anyone runs).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import math
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import nanguard

# --- models -------------------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, width: int, depth: int = 3, d_in: int = 64) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(d_in, width), nn.ReLU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(width, width), nn.ReLU()]
        self.net = nn.Sequential(*layers, nn.Linear(width, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CNN(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(2 * width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class Transformer(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, width)
        layer = nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(width, 100)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=x.device)
        return self.head(self.encoder(self.embed(x), mask=mask, is_causal=True))


class LSTM(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(32, width, batch_first=True)
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


@dataclass
class Case:
    name: str
    size: str
    build: Callable[[], nn.Module]
    batch: Callable[[torch.device], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def cases(quick: bool) -> list[Case]:
    """The S rows are the models of the watch-cost table (issue 15): MLP 64-128-128 at batch 64,
    LSTM 32x20 at batch 32, MLP 4x512 at batch 128, CNN+BN at batch 32, Transformer 2x128 at
    batch 16x32; the L rows the larger sizes."""
    def ce(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # looked up when called, as a training loop that writes ``F.cross_entropy(out, y)`` does
        # (nanguard records it as one call; a reference bound before ``attach`` is taped op by op)
        return F.cross_entropy(out, y)

    def lm_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out.flatten(0, 1), y.flatten())

    def q(b: int) -> int:
        return max(2, b // 8) if quick else b

    def mlp(size: str, width: int, depth: int, d_in: int, b: int, name: str = "MLP") -> Case:
        return Case(name, size, lambda: MLP(width, depth, d_in),
                    lambda d: (torch.randn(q(b), d_in, device=d), torch.randint(0, 10, (q(b),), device=d)), ce)

    def cnn(size: str, width: int, b: int) -> Case:
        return Case("CNN+BN", size, lambda: CNN(width),
                    lambda d: (torch.randn(q(b), 3, 32, 32, device=d), torch.randint(0, 10, (q(b),), device=d)), ce)

    def tr(size: str, width: int, b: int) -> Case:
        return Case("Transformer", size, lambda: Transformer(width),
                    lambda d: (torch.randint(0, 100, (q(b), 32), device=d),
                               torch.randint(0, 100, (q(b), 32), device=d)), lm_loss)

    def lstm(size: str, width: int, seq: int, b: int) -> Case:
        return Case("LSTM", size, lambda: LSTM(width),
                    lambda d: (torch.randn(q(b), seq, 32, device=d), torch.randint(0, 10, (q(b),), device=d)), ce)

    out = [mlp("S", 128, 3, 64, 64), lstm("S", 64, 20, 32), mlp("S", 512, 4, 512, 128, "MLP 4x512"),
           cnn("S", 16, 32), tr("S", 128, 16)]
    if not quick:
        out += [mlp("L", 1024, 3, 64, 128), cnn("L", 48, 64), tr("L", 256, 32), lstm("L", 256, 24, 64)]
    return out


# --- variants ----------------------------------------------------------------------------------


def _sherlorch() -> object | None:
    if importlib.util.find_spec("sherlorch") is None:
        return None
    import sherlorch  # type: ignore[import-not-found]

    return sherlorch


VARIANTS = ["plain", "floor", "watch", "trace", "detect_anomaly"]


def floor_check(model: nn.Module, loss: torch.Tensor) -> None:
    """What any finiteness check must pay at least, as ``GradScaler`` does: one
    ``torch._foreach_norm`` over the gradients, stacked with the loss, and one host read."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    torch.stack([*torch._foreach_norm(grads), loss.detach().reshape(())]).tolist()


def assert_detached() -> None:
    """Nothing of nanguard (or of anomaly mode) is left installed: a plain or floor block timed
    now is not slowed by another variant's global hooks."""
    from torch.nn.modules import module as _module
    from torch.optim import optimizer as _optim

    leftovers = {
        "global forward pre-hooks": len(_module._global_forward_pre_hooks),
        "global forward hooks": len(_module._global_forward_hooks),
        "wrapped Module.__call__": int(nn.Module.__call__ is not nn.Module._wrapped_call_impl),
        "wrapped autograd.backward": int(hasattr(torch.autograd.backward, "__nanguard_wrapped__")),
        "optimizer step hooks": len(_optim._global_optimizer_pre_hooks) + len(_optim._global_optimizer_post_hooks),
        "dispatch modes": int(torch._C._len_torch_dispatch_stack()),
        "anomaly mode": int(torch.is_anomaly_enabled()),
    }
    bad = {k: v for k, v in leftovers.items() if v}
    if bad:
        raise RuntimeError(f"a variant left something installed: {bad}")


#: the watch variant's guard of each model (``variant_ctx``)
_WATCH_GUARDS: dict[int, Any] = {}


@contextlib.contextmanager
def variant_ctx(name: str, model: nn.Module | None, opt: torch.optim.Optimizer | None) -> Iterator[None]:
    if name in ("plain", "floor"):
        assert_detached()
        yield
    elif name == "as-is":  # whatever is attached now (the memory table's own guard)
        yield
    elif name == "watch":
        # one guard per model for all of its blocks, detached between them: its steps go on from
        # block to block as in one long run (a run attaches once: its looks at steps 0-2 and the
        # first reads of the weights are paid in the warm-up, not again in every block)
        g = _WATCH_GUARDS.get(id(model))
        if g is None or g.model is not model:
            g = _WATCH_GUARDS[id(model)] = nanguard.attach(model, opt)
        else:
            g.install()
        try:
            yield
        finally:
            g.detach()
    elif name == "trace":
        with nanguard.locate(model):
            yield
    elif name == "detect_anomaly":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.autograd.detect_anomaly(check_nan=True):
                yield
    elif name == "sherlorch":
        mod = _sherlorch()
        assert mod is not None
        with mod.trace():  # type: ignore[attr-defined]
            yield
    else:
        raise ValueError(name)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


#: steps run and not timed at the start of every block, for every variant alike: they pay for
#: attaching the variant, which a real run pays once — the watch's one-time looks included (its
#: data look after step 0, its hazard look on steps 1-2, at trace cost: docs/check.md)
SETTLE = 3


def step_times(case: Case, variant: str, model: nn.Module, opt: torch.optim.Optimizer,
               device: torch.device, steps: int) -> list[float]:
    """Seconds of each of ``steps`` training steps of one variant, timed one by one (a device
    synchronisation after each on CUDA, for every variant alike), after :data:`SETTLE` steps
    run untimed."""
    batches = [case.batch(device) for _ in range(SETTLE + steps)]
    out: list[float] = []
    gc.collect()  # the garbage of the last block (a trace leaves much) is not this block's cost
    with variant_ctx(variant, model, opt):
        for x, y in batches:
            _sync(device)
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = case.loss(model(x), y)
            loss.backward()
            if variant == "floor":
                floor_check(model, loss)
            opt.step()
            _sync(device)
            out.append(time.perf_counter() - t0)
    return out[SETTLE:]


def time_block(case: Case, variant: str, model: nn.Module, opt: torch.optim.Optimizer,
               device: torch.device, steps: int) -> float:
    """The median time of one step over a block of ``steps`` steps of one variant."""
    return statistics.median(step_times(case, variant, model, opt, device, steps))


def measure(case: Case, variants: list[str], device: torch.device, repeats: int, steps: int) -> dict[str, float]:
    torch.manual_seed(0)
    model = case.build().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for v in variants:  # warm up each variant once (allocator, dispatch caches)
        step_times(case, v, model, opt, device, 2)
    times: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(repeats):
        # round-robin, starting each round at the next variant: no variant always runs first
        for v in variants[r % len(variants):] + variants[: r % len(variants)]:
            times[v] += step_times(case, v, model, opt, device, steps)
    return {v: statistics.median(ts) for v, ts in times.items()}


# --- RL: many small forwards per update (no_grad, or with grad as reinforce.py) ------------


class ToyEnv:
    """A cart-pole-like environment in numpy (4 numbers of state, 2 actions), deterministic for
    a seed: what an RL script steps between two updates."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.s = np.zeros(4)

    def reset(self) -> np.ndarray:
        self.s = self.rng.uniform(-0.05, 0.05, 4)
        return self.s

    def step(self, a: int) -> tuple[np.ndarray, float, bool]:
        x, v, th, w = self.s
        f = 1.0 if a else -1.0
        w = w + 0.02 * (9.8 * math.sin(th) - f * math.cos(th))
        v, x, th = v + 0.02 * f, x + 0.02 * v, th + 0.02 * w
        self.s = np.array([x, v, th, w])
        return self.s, 1.0, abs(th) > 0.2 or abs(x) > 2.4


def rl_policy() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))


def rl_update(policy: nn.Module, opt: torch.optim.Optimizer, env: ToyEnv, variant: str,
              env_steps: int) -> None:
    """One REINFORCE update: ``env_steps`` environment steps, each a ``no_grad`` forward of the
    policy and a sampled action read with ``.item()``, then one batched forward with a graph,
    the loss, ``backward()`` and ``step()``."""
    states, actions, rewards = [], [], []
    obs = env.reset()
    for _ in range(env_steps):
        s = torch.as_tensor(obs, dtype=torch.float32)
        with torch.no_grad():
            logits = policy(s)
        a = int(torch.distributions.Categorical(logits=logits).sample().item())
        states.append(obs)
        actions.append(a)
        obs, r, done = env.step(a)
        rewards.append(r)
        if done:
            obs = env.reset()
    st = torch.as_tensor(np.array(states), dtype=torch.float32)
    acts = torch.as_tensor(actions)
    logp = F.log_softmax(policy(st), -1).gather(1, acts[:, None]).squeeze(1)
    _apply(policy, opt, -(logp * normalized_returns(rewards)).mean(), variant)


def normalized_returns(rewards: list[float], gamma: float = 0.99) -> torch.Tensor:
    """The discounted returns of an episode's rewards, standardised (float32)."""
    ret, returns = 0.0, []
    for r in reversed(rewards):
        ret = r + gamma * ret
        returns.append(ret)
    returns.reverse()
    rets = torch.as_tensor(returns, dtype=torch.float32)
    return (rets - rets.mean()) / (rets.std() + 1e-8)


def _apply(policy: nn.Module, opt: torch.optim.Optimizer, loss: torch.Tensor, variant: str) -> None:
    """The update of an RL step: ``backward()``, the floor's check for that variant, ``step()``."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if variant == "floor":
        floor_check(policy, loss)
    opt.step()


def rl_update_grad(policy: nn.Module, opt: torch.optim.Optimizer, env: ToyEnv, variant: str,
                   env_steps: int) -> None:
    """One REINFORCE update as pytorch/examples' ``reinforce.py`` writes it: each of the
    ``env_steps`` environment steps a forward *with* grad, a ``Categorical`` sample read with
    ``.item()`` and its log-prob kept (a graph per step, ~35 ops outside modules with the
    distribution's argument checks); then the returns, the loss, ``backward()`` and ``step()``."""
    logps, rewards = [], []
    obs = env.reset()
    for _ in range(env_steps):
        probs = F.softmax(policy(torch.from_numpy(obs).float().unsqueeze(0)), dim=-1)
        dist = torch.distributions.Categorical(probs)
        a = dist.sample()
        logps.append(dist.log_prob(a))
        obs, r, done = env.step(int(a.item()))
        rewards.append(r)
        if done:
            obs = env.reset()
    loss = torch.cat([-lp * g for lp, g in zip(logps, normalized_returns(rewards))]).sum()
    _apply(policy, opt, loss, variant)


RL_LOOPS: dict[str, Callable[..., None]] = {"no_grad": rl_update, "grad": rl_update_grad}


def rl_times(variant: str, policy: nn.Module, opt: torch.optim.Optimizer, env: ToyEnv,
             steps: int, env_steps: int, loop: str = "no_grad") -> list[float]:
    out = []
    update = RL_LOOPS[loop]
    gc.collect()
    with variant_ctx(variant, policy, opt):
        for _ in range(SETTLE + steps):
            t0 = time.perf_counter()
            update(policy, opt, env, variant, env_steps)
            out.append(time.perf_counter() - t0)
    return out[SETTLE:]


def measure_rl(variants: list[str], repeats: int, steps: int, env_steps: int,
               loop: str = "no_grad") -> dict[str, float]:
    torch.manual_seed(0)
    policy = rl_policy()
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    env = ToyEnv(0)
    for v in variants:
        rl_times(v, policy, opt, env, 1, env_steps, loop)
    times: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(repeats):
        for v in variants[r % len(variants):] + variants[: r % len(variants)]:
            times[v] += rl_times(v, policy, opt, env, steps, env_steps, loop)
    return {v: statistics.median(ts) for v, ts in times.items()}


# --- a tiny loop: thousands of steps of ~0.2 ms, a hand-written update ----------------------


class TinyLogReg:
    """Logistic regression on 200 noisy points of 10 features, written as GRIST's numerical-bug
    programs are: no module, no optimizer, ``w -= lr * w.grad`` under ``no_grad`` — every op
    outside any module, each step ~0.15-0.2 ms of plain work on a CPU."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(200, 10, generator=g)
        self.y = (self.x[:, 0] + 0.5 * self.x[:, 1] + torch.randn(200, generator=g) > 0).float()
        self.w = torch.zeros(10, requires_grad=True)
        self.b = torch.zeros(1, requires_grad=True)

    def step(self, variant: str, lr: float = 0.1) -> None:
        p = torch.sigmoid(self.x @ self.w + self.b)
        loss = -(self.y * torch.log(p) + (1 - self.y) * torch.log(1 - p)).mean()
        loss.backward()
        assert self.w.grad is not None and self.b.grad is not None
        if variant == "floor":
            torch.stack([*torch._foreach_norm([self.w.grad, self.b.grad]), loss.detach()]).tolist()
        with torch.no_grad():
            self.w -= lr * self.w.grad
            self.b -= lr * self.b.grad
            self.w.grad.zero_()
            self.b.grad.zero_()


def tiny_run(variant: str, steps: int) -> float:
    """Wall seconds of a whole run of ``steps`` steps of :class:`TinyLogReg` under ``variant``
    (attached once, as ``nanguard run`` does: its one-time looks and its later ones included)."""
    task = TinyLogReg()
    gc.collect()
    _WATCH_GUARDS.pop(id(None), None)  # a fresh guard per run: a run attaches once
    t0 = time.perf_counter()
    with variant_ctx(variant, None, None):
        for _ in range(steps):
            task.step(variant)
    return time.perf_counter() - t0


def measure_tiny(variants: list[str], repeats: int, steps: int) -> dict[str, float]:
    """The median whole-run time of each variant, the runs round-robin."""
    times: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(repeats):
        for v in variants[r % len(variants):] + variants[: r % len(variants)]:
            times[v].append(tiny_run(v, steps))
    return {v: statistics.median(ts) for v, ts in times.items()}


# --- replay latency and memory --------------------------------------------------------------


def replay_latency(case: Case, device: torch.device) -> float:
    """Time from the failing step's check to the raised finding, in units of one plain step."""
    torch.manual_seed(0)
    model = case.build().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = case.batch(device)
    plain = time_block(case, "plain", model, opt, device, 5)
    first = next(model.parameters())
    with nanguard.attach(model, opt):
        opt.zero_grad()
        case.loss(model(x), y).backward()
        with torch.no_grad():
            first.grad.view(-1)[0] = float("nan")  # poisoned after backward: replay runs
        t0 = time.perf_counter()
        try:
            opt.step()
        except nanguard.NonFiniteError:
            pass
        dt = time.perf_counter() - t0
    return dt / plain


def _nbytes(obj: object) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v) for v in obj)
    return 0


def held_mb(case: Case, policy: str, device: torch.device) -> float:
    """Tensor memory nanguard itself holds after 20 healthy steps (MB): with ``raise``, the copy
    kept to replay an update (when affordable); with ``recover``, that plus the rollback snapshot
    (taken every step here, the worst case). Counted from the guard's own objects, exactly — a
    process's RSS is too coarse for this on the CPU."""
    torch.manual_seed(0)
    m = case.build().to(device)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    g = nanguard.attach(m, opt, policy=policy, snapshot_every=1)
    try:
        time_block(case, "as-is", m, opt, device, 20)
        held = _nbytes(g.update_replay.copy)
        if g.snapshots.last is not None:
            held += g.snapshots.last.nbytes
    finally:
        g.detach()
    return held / 2**20


def snapshot_cost(case: Case, device: torch.device, plain_step_s: float, every: int = 50) -> float:
    """Time of one rollback snapshot (a CPU copy of weights, buffers and optimizer state), as a
    share of ``every`` plain steps: its amortised cost at the default interval."""
    from nanguard.torch.snapshot import Snapshotter, floating_buffers

    torch.manual_seed(0)
    m = case.build().to(device)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    time_block(case, "plain", m, opt, device, 1)
    snap = Snapshotter(every=every)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        snap.take(0, list(m.parameters()), floating_buffers([m]), [opt], [], [])
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / (every * plain_step_s)


def state_mb(case: Case) -> float:
    """Weights + floating buffers + AdamW state of a model after one step (MB): the size of a
    rollback snapshot."""
    torch.manual_seed(0)
    m = case.build()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    time_block(case, "plain", m, opt, torch.device("cpu"), 1)
    n = sum(p.numel() * p.element_size() for p in m.parameters())
    n += sum(b.numel() * b.element_size() for b in m.buffers() if b.is_floating_point())
    n += sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values()
             if isinstance(v, torch.Tensor))
    return n / 2**20


# --- main -----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes, few repeats (CI smoke run)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: as is)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory table")
    p.add_argument("--json", help="write the numbers to this file")
    p.add_argument("--variants", help="comma-separated subset of the variants (plain is always in)")
    p.add_argument("--rl-only", action="store_true", help="only the RL row")
    p.add_argument("--tiny-only", action="store_true", help="only the tiny loop's row")
    p.add_argument("--tiny-steps", type=int, default=None, help="steps of the tiny loop's runs (30000)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    repeats = args.repeats or (3 if args.quick else 12)
    steps = args.steps or (3 if args.quick else 15)
    variants = list(VARIANTS) + (["sherlorch"] if _sherlorch() is not None else [])
    if args.variants:
        wanted = {"plain", *args.variants.split(",")}
        variants = [v for v in variants if v in wanted]
    print(f"# python benchmarks/overhead.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    print(f"# torch {torch.__version__}, device {device}, threads {torch.get_num_threads()}, "
          f"{repeats} round-robin repeats x {steps} steps, median step time")
    print(f"# load average at start {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs; "
          "each variant is attached only during its own blocks (checked before every plain/floor block)")
    if _sherlorch() is None:
        print("# sherlorch: not installed (pip install sherlorch to add its column)")
    results: list[dict[str, object]] = []
    header = "| model | size | plain ms/step | " + " | ".join(v for v in variants[1:]) + " |"
    if not (args.rl_only or args.tiny_only):
        print()
        print(header)
        print("|" + "---|" * (3 + len(variants) - 1))
    for i, case in enumerate([] if args.rl_only or args.tiny_only else cases(args.quick)):
        gc.collect()
        med = measure(case, variants, device, repeats, steps)
        base = med["plain"]
        ratios = {v: med[v] / base for v in variants}
        row = f"| {case.name} | {case.size} | {base * 1e3:.2f} | " + " | ".join(
            f"{ratios[v]:.3f}x" for v in variants[1:]
        ) + " |"
        print(row, flush=True)
        results.append({"model": case.name, "size": case.size, "index": i, "plain_s": base,
                        **{f"{v}_ratio": ratios[v] for v in variants}})
    env_steps = 20 if args.quick else 200
    rl_variants = [v for v in variants if v != "sherlorch"]
    if not args.tiny_only:
        print()
        print(f"| RL loop | plain ms/update | {' | '.join(rl_variants[1:])} |")
        print("|---|---|" + "---|" * (len(rl_variants) - 1))
    labels = {"no_grad": f"REINFORCE, {env_steps} no_grad env steps per update",
              "grad": f"REINFORCE as pytorch/examples, {env_steps} env steps with grad per update"}
    rl_results = []
    for loop, label in ({} if args.tiny_only else labels).items():
        med = measure_rl(rl_variants, repeats, max(2, steps // 3), env_steps, loop)
        base = med["plain"]
        print(f"| {label} | {base * 1e3:.2f} | "
              + " | ".join(f"{med[v] / base:.3f}x" for v in rl_variants[1:]) + " |", flush=True)
        rl_results.append({"model": "REINFORCE", "size": f"{env_steps} env steps", "loop": loop,
                           "plain_s": base, **{f"{v}_ratio": med[v] / base for v in rl_variants}})
    if not args.rl_only:
        tiny_steps = args.tiny_steps or (300 if args.quick else 30_000)
        tiny_variants = [v for v in rl_variants if v != "trace"]
        print()
        print(f"| tiny loop, whole run | plain s | {' | '.join(tiny_variants[1:])} |")
        print("|---|---|" + "---|" * (len(tiny_variants) - 1))
        med = measure_tiny(tiny_variants, 1 if args.quick else 3, tiny_steps)
        base = med["plain"]
        print(f"| logistic regression, hand-written update, {tiny_steps} steps | {base:.2f} | "
              + " | ".join(f"{med[v] / base:.3f}x" for v in tiny_variants[1:]) + " |", flush=True)
        rl_results.append({"model": "logistic regression", "size": f"{tiny_steps} steps", "loop": "tiny",
                           "plain_s": base, **{f"{v}_ratio": med[v] / base for v in tiny_variants}})
    if args.rl_only or args.tiny_only:
        return 0
    print()
    print("| model | size | replay: failure → finding, in plain steps |")
    print("|---|---|---|")
    for r, case in zip(results, cases(args.quick)):
        lat = replay_latency(case, device)
        r["replay_steps"] = lat
        print(f"| {case.name} | {case.size} | {lat:.2f} |", flush=True)
    if not args.no_memory:
        print()
        print("| model | size | weights + AdamW state MB | held by watch MB | held by recover MB "
              "| snapshot cost at every 50 steps |")
        print("|---|---|---|---|---|---|")
        for r, case in zip(results, cases(args.quick)):
            mem = {p: held_mb(case, p, device) for p in ("raise", "recover")}
            cost = snapshot_cost(case, device, float(r["plain_s"]))  # type: ignore[arg-type]
            r.update({"state_mb": state_mb(case), "held_watch_mb": mem["raise"],
                      "held_recover_mb": mem["recover"], "snapshot_cost": cost})
            print(f"| {r['model']} | {r['size']} | {state_mb(case):.2f} | {mem['raise']:.2f} | "
                  f"{mem['recover']:.2f} | {cost * 100:.2f} % |", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results + rl_results, fh, indent=1, default=lambda o: None if isinstance(o, float) and not math.isfinite(o) else o)
    return 0


if __name__ == "__main__":
    sys.exit(main())
