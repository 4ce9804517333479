# expect: {"cause": "nonfinite-input", "phase": "data", "op": "input", "module": null}
# about: a CSV file with one empty cell; numpy.genfromtxt turns it into NaN and the batch holding that row carries it into an MLP.
import os
import tempfile

import numpy as np
import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)


def write_csv(path, n=640):
    rng = np.random.default_rng(0)
    feats = rng.normal(size=(n, 6))
    target = feats @ np.array([0.5, -1.0, 2.0, 0.0, 1.5, -0.3]) + 0.1 * rng.normal(size=n)
    with open(path, "w") as fh:
        fh.write("a,b,c,d,e,f,target\n")
        for i in range(n):
            cells = [f"{v:.5f}" for v in feats[i]] + [f"{target[i]:.5f}"]
            if i == 333:
                cells[2] = ""  # a missing measurement
            fh.write(",".join(cells) + "\n")


def main():
    path = os.path.join(tempfile.mkdtemp(), "train.csv")
    write_csv(path)
    table = np.genfromtxt(path, delimiter=",", skip_header=1, dtype=np.float32)
    if FIXED:  # drop the rows with a missing cell
        table = table[np.isfinite(table).all(axis=1)]
    x = torch.from_numpy(table[:, :6])
    y = torch.from_numpy(table[:, 6:])
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)

    model = nn.Sequential(nn.Linear(6, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.MSELoss()
    for epoch in range(2):
        for step, (xb, yb) in enumerate(loader):
            optimizer.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            optimizer.step()
            if step % 5 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
    print(f"final loss {loss.item():.6g}")


if __name__ == "__main__":
    main()
