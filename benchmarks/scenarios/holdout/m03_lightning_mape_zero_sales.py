# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.div.Tensor", "module": [null, ""]}
# about: held out (round 4, modern stack): written by someone who had not read the code. A PyTorch Lightning LightningModule (unmodified Trainer, automatic optimization, Adam) forecasting daily store sales from 14 lagged days + day-of-week, trained on the business metric MAPE = mean(|pred - y| / y). About 0.2% of days the store was closed and sold 0 units; the first batch holding such a day (global step 8 here) divides a finite |pred - y| by y = 0 in training_step, giving inf (the loss prints inf at step 8, then NaN from the next step on, since the inf loss makes NaN gradients and NaN weights). Origin: aten.div.Tensor in the forward computation of training_step. Note Lightning runs training_step inside the closure passed to optimizer.step(), but it is still the forward pass of the step, so the phase is forward. The division is written in training_step, a method of the root LightningModule but not inside any module forward call, so module null or "" (the root) are both accepted.
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
import lightning.pytorch as pl

torch.set_num_threads(1)
pl.seed_everything(0, verbose=False)


def make_store_data(n_days=1200, n_lags=14):
    g = torch.Generator().manual_seed(1)
    t = torch.arange(n_days + n_lags, dtype=torch.float32)
    weekly = 1.0 + 0.3 * torch.sin(2 * torch.pi * t / 7)
    sales = (40.0 * weekly + 5.0 * torch.randn(n_days + n_lags, generator=g)).clamp(min=1.0).round()
    closed = torch.rand(n_days + n_lags, generator=g) < 0.002  # store closed (holidays, refits)
    sales[closed] = 0.0
    x = torch.stack([sales[i:i + n_lags] for i in range(n_days)]) / 50.0
    dow = torch.nn.functional.one_hot((t[n_lags:n_lags + n_days] % 7).long(), 7).float()
    y = sales[n_lags:n_lags + n_days]
    return torch.cat([x, dow], 1), y


class DemandForecaster(pl.LightningModule):
    def __init__(self, n_in, hidden=64, lr=1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, x):
        return 50.0 * self.net(x).squeeze(-1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        pred = self(x)
        # business metric: mean absolute percentage error
        mape = ((pred - y).abs() / y).mean()
        self.log("train_mape", mape, prog_bar=False)
        if batch_idx % 10 == 0:
            print(f"step {self.global_step:3d} mape {mape.item():.4f}")
        return mape

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


if __name__ == "__main__":
    X, Y = make_store_data()
    loader = DataLoader(TensorDataset(X, Y), batch_size=32, shuffle=True, num_workers=0)
    model = DemandForecaster(X.shape[1])
    trainer = pl.Trainer(max_steps=60, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, loader)
    print("final train_mape", trainer.callback_metrics.get("train_mape"))
