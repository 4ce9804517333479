# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.log.default", "module": ""}
# about: held out (round late 2): MLP fraud classifier (sigmoid output) trained with Adam and a textbook hand-written BCE on separable data; logits grow until sigmoid rounds to exactly 1.0 for a positive sample and log(1 - p) gives -inf at step 124.
import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=400)
parser.add_argument("--lr", type=float, default=1e-3)
args = parser.parse_args()

torch.manual_seed(4)

# synthetic transaction features; label = "fraud" if a (hidden) score is positive
N, D = 3000, 20
X = torch.randn(N, D)
w_true = torch.randn(D)
score = X @ w_true
keep = score.abs() > 0.5  # clear margin between the classes
X, y = X[keep], (score[keep] > 0).float()
N = X.shape[0]


class FraudNet(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d, 64), nn.ReLU(),
            nn.Linear(64, 32), nn.ReLU(),
            nn.Linear(32, 1),
        )

    def forward(self, x):
        return torch.sigmoid(self.net(x)).squeeze(-1)


def binary_cross_entropy(p, target):
    # textbook formula
    return -(target * torch.log(p) + (1 - target) * torch.log(1 - p)).mean()


model = FraudNet(D)
opt = torch.optim.Adam(model.parameters(), lr=args.lr)

bs = 256
for step in range(args.steps):
    idx = torch.randint(0, N, (bs,))
    p = model(X[idx])
    loss = binary_cross_entropy(p, y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 25 == 0:
        acc = ((p > 0.5).float() == y[idx]).float().mean().item()
        print(f"step {step:4d}  bce {loss.item():.5f}  acc {acc:.3f}")

print(f"final loss {loss.item():.5f}")
