"""The seed scenario in PyTorch: a ReLU network trained with a learning rate far too high.

In 2015 this setup made TensorFlow stop with ``ReluGrad input is not finite``: the error fired in
the backward pass at the first ReLU that saw the NaN, far from the layer where it was made, and
said nothing about why. Here nanguard watches the same kind of run and reports the op, the
module, the line, the step and the cause. Copy this file and change ``LR`` to see the difference.

Run it with ``nanguard demo`` (or ``python -m nanguard.demos.seed_torch``).
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

import nanguard

LR = 4.0  # far too high for this network: the weights grow ~1e8x per step
STEPS = 200
SEED = 0


def make_data(n: int = 2048, d: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """A synthetic regression task: y = relu(x·w) + x₀."""
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, 1, generator=g)
    return x, (x @ w).relu() + x[:, :1]


def make_model(d: int = 16) -> nn.Module:
    return nn.Sequential(
        OrderedDict(
            fc1=nn.Linear(d, 64),
            relu1=nn.ReLU(),
            fc2=nn.Linear(64, 64),
            relu2=nn.ReLU(),
            head=nn.Linear(64, 1),
        )
    )


def train(lr: float, steps: int = STEPS, policy: str = "raise") -> tuple[nanguard.Guard, list[float]]:
    """An ordinary loop; ``nanguard.attach`` is the only extra line."""
    torch.manual_seed(SEED)
    x_all, y_all = make_data()
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses: list[float] = []
    with nanguard.attach(model, optimizer, policy=policy) as guard:
        for _ in range(steps):
            idx = torch.randint(0, len(x_all), (64,))
            x, y = x_all[idx], y_all[idx]
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()  # nanguard checks loss and gradients here, before the update
            losses.append(loss.item())
    return guard, losses


if __name__ == "__main__":
    try:
        train(LR)
    except nanguard.NonFiniteError as err:
        print(err)
