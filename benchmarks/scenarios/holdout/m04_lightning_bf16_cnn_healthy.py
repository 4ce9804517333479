# expect: {"healthy": true}
# about: held out (round 4, modern stack): written by someone who had not read the code. HEALTHY control. A small BatchNorm CNN classifying synthetic bar/square images, trained with an unmodified PyTorch Lightning Trainer (max_steps=40, accelerator="cpu", precision="bf16-mixed" i.e. CPU bfloat16 autocast, gradient_clip_val=1.0, a mid-run validation loop) and AdamW + a per-step OneCycleLR scheduler from configure_optimizers, label-smoothed cross-entropy. Everything is well scaled; no NaN/Inf is ever produced (checked with plain python: loss falls from 1.30 to ~0.78 over 40 steps, val_acc 0.73), so nothing should be reported and the output must be unchanged.
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import lightning.pytorch as pl

torch.set_num_threads(1)
pl.seed_everything(0, verbose=False)


def make_shapes(n, size=16, generator=None):
    """synthetic 'shapes' dataset: 0 = horizontal bar, 1 = vertical bar, 2 = square, 3 = noise"""
    imgs = 0.2 * torch.randn(n, 1, size, size, generator=generator)
    labels = torch.randint(0, 4, (n,), generator=generator)
    pos = torch.randint(2, size - 6, (n, 2), generator=generator)
    for i in range(n):
        r, c = pos[i].tolist()
        if labels[i] == 0:
            imgs[i, 0, r:r + 2, 2:size - 2] += 1.0
        elif labels[i] == 1:
            imgs[i, 0, 2:size - 2, c:c + 2] += 1.0
        elif labels[i] == 2:
            imgs[i, 0, r:r + 4, c:c + 4] += 1.0
    return imgs, labels


class ShapeClassifier(pl.LightningModule):
    def __init__(self, lr=3e-3, max_steps=40):
        super().__init__()
        self.save_hyperparameters()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(0.1), nn.Linear(32, 4))

    def forward(self, x):
        return self.classifier(self.features(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y, label_smoothing=0.05)
        self.log("train_loss", loss)
        if self.global_step % 10 == 0:
            print(f"step {self.global_step:3d} loss {loss.item():.4f}")
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        acc = (self(x).argmax(1) == y).float().mean()
        self.log("val_acc", acc)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.05)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=self.hparams.lr, total_steps=self.hparams.max_steps)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


if __name__ == "__main__":
    g = torch.Generator().manual_seed(0)
    xtr, ytr = make_shapes(1024, generator=g)
    xva, yva = make_shapes(256, generator=g)
    train = DataLoader(TensorDataset(xtr, ytr), batch_size=32, shuffle=True)
    val = DataLoader(TensorDataset(xva, yva), batch_size=128)
    model = ShapeClassifier(max_steps=40)
    trainer = pl.Trainer(max_steps=40, accelerator="cpu", devices=1, precision="bf16-mixed",
                         gradient_clip_val=1.0, val_check_interval=20, limit_val_batches=2,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(model, train, val)
    m = trainer.callback_metrics
    print(f"final train_loss {m['train_loss'].item():.4f} val_acc {m['val_acc'].item():.3f}")
