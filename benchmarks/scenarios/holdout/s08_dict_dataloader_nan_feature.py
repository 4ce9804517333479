# expect: {"cause": "nonfinite-input", "phase": "data", "op": "input", "module": null}
# about: held out: written after the suite by someone who had not read it. Tabular regression with a Dataset that returns dicts, a DataLoader with the default
# Tabular regression with a Dataset that returns dicts, a DataLoader with the default
# collate (-> dict of batched tensors), an MLP with BatchNorm. One feature of one row is
# NaN (a failed join upstream).
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(0)


class TabularDataset(Dataset):
    def __init__(self, n=600):
        self.x = torch.randn(n, 10)
        self.y = self.x[:, :3].sum(1, keepdim=True) + 0.1 * torch.randn(n, 1)
        self.x[397, 4] = float("nan")

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.y[i], "id": i}


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(10, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, batch):
        return self.net(batch["x"])


loader = DataLoader(TabularDataset(), batch_size=50, shuffle=False)
model = Regressor()
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for epoch in range(2):
    for step, batch in enumerate(loader):
        pred = model(batch)
        loss = F.mse_loss(pred, batch["y"])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 4 == 0:
            print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
