"""Multiple-instance learning: each bag holds 16 synthetic "patch" feature vectors and is
positive if any patch carries a hidden signature; a gated attention-pooling head is trained with BCE.
Latent hazard (line 24): AttentionPool.forward calls torch.exp(scores) with no max subtraction; it
overflows past a score of ~88, but tanh-gated scores with small weights peak near 6."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class AttentionPool(nn.Module):
    """Ilse et al. style gated attention pooling, softmax written out by hand."""

    def __init__(self, dim, att_dim=32):
        super().__init__()
        self.V = nn.Linear(dim, att_dim)
        self.U = nn.Linear(dim, att_dim)
        self.w = nn.Linear(att_dim, 1, bias=False)

    def forward(self, h):
        # h: (B, N, D)
        scores = self.w(torch.tanh(self.V(h)) * torch.sigmoid(self.U(h))).squeeze(-1)
        e = torch.exp(scores)
        alpha = e / e.sum(dim=1, keepdim=True)
        return (alpha.unsqueeze(-1) * h).sum(dim=1), alpha


class BagClassifier(nn.Module):
    def __init__(self, in_dim=20, dim=48):
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(in_dim, dim), nn.ReLU(), nn.Linear(dim, dim), nn.ReLU())
        self.pool = AttentionPool(dim)
        self.cls = nn.Linear(dim, 1)

    def forward(self, bags):
        pooled, _ = self.pool(self.embed(bags))
        return self.cls(pooled).squeeze(-1)


def sample_bags(n_bags, bag_size, in_dim, signature, gen):
    bags = torch.randn(n_bags, bag_size, in_dim, generator=gen)
    labels = (torch.rand(n_bags, generator=gen) < 0.5).float()
    which = torch.randint(0, bag_size, (n_bags,), generator=gen)
    pos = labels.bool()
    bags[pos, which[pos]] += 2.0 * signature
    return bags, labels


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    in_dim = 20
    signature = F.normalize(torch.randn(in_dim, generator=gen), dim=0) * 2.0

    model = BagClassifier(in_dim)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        bags, labels = sample_bags(32, 16, in_dim, signature, gen)
        logits = model(bags)
        loss = F.binary_cross_entropy_with_logits(logits, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            acc = ((logits > 0).float() == labels).float().mean().item()
            print(f"step {step} bce {loss.item():.4f} acc {acc:.2f}")
    print(f"final bce {loss.item():.4f}")


if __name__ == "__main__":
    main()
