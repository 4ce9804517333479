"""Overhead of nanguard on healthy training steps, against detect_anomaly (and sherlorch).

Usage::

    python benchmarks/overhead.py                 # full table (a few minutes on 2 CPU cores)
    python benchmarks/overhead.py --quick         # CI smoke run: tiny sizes, 3 repeats
    python benchmarks/overhead.py --device cuda   # on a GPU (see benchmarks/gpu_check.sh)

For each model and size, the variants run round-robin (A B C A B C …, so drift of the machine
cancels out), each running a block of training steps timed one by one; the table gives the median
step time of each variant (over all its blocks) as a ratio to plain training. Timing is never asserted anywhere: this prints numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import math
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import nanguard

# --- models -------------------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
            nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10),
        )

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
    ce = F.cross_entropy

    def lm_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out.flatten(0, 1), y.flatten())

    sizes = {
        "S": {"mlp": 128, "cnn": 16, "tr": 64, "lstm": 64, "batch": 64},
        "L": {"mlp": 1024, "cnn": 48, "tr": 256, "lstm": 256, "batch": 128},
    }
    out = []
    for size, w in sizes.items():
        if quick and size == "L":
            continue
        b = 8 if quick else w["batch"]
        out += [
            Case("MLP", size, lambda n=w["mlp"]: MLP(n),
                 lambda d, b=b: (torch.randn(b, 64, device=d), torch.randint(0, 10, (b,), device=d)), ce),
            Case("CNN+BN", size, lambda n=w["cnn"]: CNN(n),
                 lambda d, b=b: (torch.randn(b // 2, 3, 32, 32, device=d),
                                 torch.randint(0, 10, (b // 2,), device=d)), ce),
            Case("Transformer", size, lambda n=w["tr"]: Transformer(n),
                 lambda d, b=b: (torch.randint(0, 100, (max(1, b // 4), 32), device=d),
                                 torch.randint(0, 100, (max(1, b // 4), 32), device=d)), lm_loss),
            Case("LSTM", size, lambda n=w["lstm"]: LSTM(n),
                 lambda d, b=b: (torch.randn(b // 2, 24, 32, device=d),
                                 torch.randint(0, 10, (b // 2,), device=d)), ce),
        ]
    return out


# --- variants ----------------------------------------------------------------------------------


def _sherlorch() -> object | None:
    if importlib.util.find_spec("sherlorch") is None:
        return None
    import sherlorch  # type: ignore[import-not-found]

    return sherlorch


VARIANTS = ["plain", "watch", "trace", "detect_anomaly"]


@contextlib.contextmanager
def variant_ctx(name: str, model: nn.Module, opt: torch.optim.Optimizer) -> Iterator[None]:
    if name == "plain":
        yield
    elif name == "watch":
        with nanguard.attach(model, opt):
            yield
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


def step_times(case: Case, variant: str, model: nn.Module, opt: torch.optim.Optimizer,
               device: torch.device, steps: int) -> list[float]:
    """Seconds of each of ``steps`` training steps of one variant, timed one by one (a device
    synchronisation after each on CUDA, for every variant alike). The first step of a block pays
    for attaching the variant, which a real run pays once: the median leaves it out."""
    batches = [case.batch(device) for _ in range(steps)]
    out: list[float] = []
    with variant_ctx(variant, model, opt):
        for x, y in batches:
            _sync(device)
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = case.loss(model(x), y)
            loss.backward()
            opt.step()
            _sync(device)
            out.append(time.perf_counter() - t0)
    return out


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
        time_block(case, "plain", m, opt, device, 20)
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
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    repeats = args.repeats or (3 if args.quick else 12)
    steps = args.steps or (3 if args.quick else 15)
    variants = list(VARIANTS) + (["sherlorch"] if _sherlorch() is not None else [])
    print(f"# python benchmarks/overhead.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    print(f"# torch {torch.__version__}, device {device}, threads {torch.get_num_threads()}, "
          f"{repeats} round-robin repeats x {steps} steps, median step time")
    if _sherlorch() is None:
        print("# sherlorch: not installed (pip install sherlorch to add its column)")
    results: list[dict[str, object]] = []
    header = "| model | size | plain ms/step | " + " | ".join(v for v in variants[1:]) + " |"
    print()
    print(header)
    print("|" + "---|" * (3 + len(variants) - 1))
    for i, case in enumerate(cases(args.quick)):
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
            json.dump(results, fh, indent=1, default=lambda o: None if isinstance(o, float) and not math.isfinite(o) else o)
    return 0


if __name__ == "__main__":
    sys.exit(main())
