# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.mse_loss.default", "module": ["", null]}
# about: held out (lr round): 3-hidden-layer MLP on synthetic standardised house prices with Adam (+L2 weight_decay) and nn.MSELoss at lr=1e5 instead of a sane 1e-3 (10^8x), after one Adam step the prediction overflows the MSE to inf at step 1.
"""Tabular regression (synthetic house prices, 12 features, standardised target) with a 3-hidden-layer MLP; Adam + L2."""
import os

import torch
import torch.nn as nn

torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"


class Hparams:
    lr = 1e-3 if FIXED else 1e5
    weight_decay = 1e-4
    hidden = 128
    epochs = 20
    batch = 128


def make_table(n=2000, seed=11):
    g = torch.Generator().manual_seed(seed)
    area = 50 + 150 * torch.rand(n, generator=g)
    rooms = torch.randint(1, 7, (n,), generator=g).float()
    age = 100 * torch.rand(n, generator=g)
    dist = 30 * torch.rand(n, generator=g)
    extra = torch.randn(n, 8, generator=g)
    price = 3.0 * area + 20 * rooms - 0.8 * age - 4 * dist + 0.02 * area * rooms + 10 * extra[:, 0] \
        + 15 * torch.randn(n, generator=g)
    x = torch.cat([torch.stack([area, rooms, age, dist], 1), extra], 1)
    x = (x - x.mean(0)) / x.std(0)
    y = ((price - price.mean()) / price.std())[:, None]
    return x, y


class PriceMLP(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, 1),
        )

    def forward(self, x):
        return self.net(x)


def main(hp=Hparams):
    torch.manual_seed(0)
    x, y = make_table()
    xtr, ytr, xva, yva = x[:1600], y[:1600], x[1600:], y[1600:]
    model = PriceMLP(x.shape[1], hp.hidden)
    loss_fn = nn.MSELoss()
    opt = torch.optim.Adam(model.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
    step = 0
    for epoch in range(hp.epochs):
        perm = torch.randperm(len(xtr))
        for i in range(0, len(xtr), hp.batch):
            b = perm[i:i + hp.batch]
            loss = loss_fn(model(xtr[b]), ytr[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 25 == 0:
                print(f"step {step} loss {loss.item():.4f}")
            step += 1
    with torch.no_grad():
        val = loss_fn(model(xva), yva).item()
    print(f"final loss {val}")


if __name__ == "__main__":
    main()
