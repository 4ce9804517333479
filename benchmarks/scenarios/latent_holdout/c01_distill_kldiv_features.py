"""Healthy control: knowledge distillation of a wide teacher MLP into a narrow student on a
synthetic 6-class task, using F.kl_div on log_softmax inputs (log_target=True), hard-label
cross-entropy, and a cosine feature-matching term via F.normalize (which has its own eps)."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self, n_in, hidden, n_feat, n_classes):
        super().__init__()
        self.features = nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, n_feat))
        self.classifier = nn.Linear(n_feat, n_classes)

    def forward(self, x):
        f = self.features(x)
        return f, self.classifier(F.relu(f))


def distill_loss(s_logits, t_logits, s_feat, t_feat, y, T=3.0, alpha=0.7):
    soft = F.kl_div(F.log_softmax(s_logits / T, dim=-1), F.log_softmax(t_logits / T, dim=-1),
                    reduction="batchmean", log_target=True) * T * T
    hard = F.cross_entropy(s_logits, y)
    feat = 1.0 - (F.normalize(s_feat, dim=-1) * F.normalize(t_feat, dim=-1)).sum(-1).mean()
    return alpha * soft + (1 - alpha) * hard + 0.1 * feat


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()

    torch.manual_seed(0)
    n_in, n_classes = 16, 6
    centers = 2.0 * torch.randn(n_classes, n_in)
    y_all = torch.randint(0, n_classes, (3000,))
    x_all = centers[y_all] + torch.randn(3000, n_in)

    teacher = Net(n_in, 128, 32, n_classes)
    t_opt = torch.optim.Adam(teacher.parameters(), lr=3e-3)
    for _ in range(60):  # quick teacher fit
        ix = torch.randint(0, 3000, (256,))
        _, logits = teacher(x_all[ix])
        t_loss = F.cross_entropy(logits, y_all[ix])
        t_opt.zero_grad()
        t_loss.backward()
        t_opt.step()
    teacher.eval()

    student = Net(n_in, 24, 32, n_classes)
    opt = torch.optim.SGD(student.parameters(), lr=0.05, momentum=0.9)
    for step in range(args.steps):
        ix = torch.randint(0, 3000, (128,))
        xb, yb = x_all[ix], y_all[ix]
        with torch.no_grad():
            t_feat, t_logits = teacher(xb)
        s_feat, s_logits = student(xb)
        loss = distill_loss(s_logits, t_logits, s_feat, t_feat, yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            print(f"step {step} distill {loss.item():.4f}")
    print(f"final distill {loss.item():.4f}")


if __name__ == "__main__":
    main()
