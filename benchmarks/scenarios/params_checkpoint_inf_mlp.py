# expect: {"cause": "nonfinite-parameters", "phase": "forward", "op": "parameter", "module": "decoder"}
# about: training resumes from a checkpoint (torch.save / torch.load(weights_only=True)) in which one weight of `decoder` is inf, written by an earlier run that had diverged.
import os
import tempfile

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(10, 64), nn.ReLU())
        self.decoder = nn.Linear(64, 64)
        self.head = nn.Linear(64, 1)

    def forward(self, x):
        return self.head(torch.relu(self.decoder(self.encoder(x))))


def previous_run(path):
    model = Regressor()
    state = model.state_dict()
    state["decoder.weight"][17, 3] = float("inf")  # the old run blew up here before saving
    torch.save({"model": state, "step": 1200}, path)


def main():
    path = os.path.join(tempfile.mkdtemp(), "ckpt.pt")
    previous_run(path)

    model = Regressor()
    ckpt = torch.load(path, weights_only=True)
    model.load_state_dict(ckpt["model"])
    if FIXED:  # check the weights after loading; re-initialise a layer that came in non-finite
        for m in model.modules():
            if isinstance(m, nn.Linear) and not all(torch.isfinite(p).all() for p in m.parameters()):
                m.reset_parameters()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x_all = torch.randn(512, 10)
    y_all = x_all[:, :2].sum(1, keepdim=True)
    for step in range(ckpt["step"], ckpt["step"] + 30):
        idx = torch.randint(0, 512, (32,))
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x_all[idx]), y_all[idx])
        loss.backward()
        optimizer.step()
        if step % 5 == 0:
            print(f"step {step} loss {loss.item():.4f}")
    print(f"final loss {loss.item():.6g}")


if __name__ == "__main__":
    main()
