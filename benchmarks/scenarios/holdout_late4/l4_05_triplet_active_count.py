# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.div.Tensor", "module": ""}
# about: held out (round late 4): a triplet-loss embedding net whose loss is averaged over the number of still-active (margin-violating) triplets; as training succeeds the active count drifts down and at step 44 it reaches 0, so sum/count = 0/0 gives NaN in aten.div.Tensor outside the model.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Embedder(nn.Module):
    def __init__(self, d_in, d_emb):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
        self.proj = nn.Linear(64, d_emb)

    def forward(self, x):
        return self.proj(self.body(x))


def sample_triplets(labels_by_class, n, gen):
    n_classes = len(labels_by_class)
    a_cls = torch.randint(0, n_classes, (n,), generator=gen)
    shift = torch.randint(1, n_classes, (n,), generator=gen)
    n_cls = (a_cls + shift) % n_classes
    anchors, positives, negatives = [], [], []
    for c_a, c_n in zip(a_cls.tolist(), n_cls.tolist()):
        pool = labels_by_class[c_a]
        i, j = torch.randint(0, len(pool), (2,), generator=gen).tolist()
        k = torch.randint(0, len(labels_by_class[c_n]), (1,), generator=gen).item()
        anchors.append(pool[i])
        positives.append(pool[j])
        negatives.append(labels_by_class[c_n][k])
    return torch.tensor(anchors), torch.tensor(positives), torch.tensor(negatives)


def triplet_loss_active_mean(a, p, n, margin):
    d_ap = (a - p).pow(2).sum(1)
    d_an = (a - n).pow(2).sum(1)
    losses = F.relu(d_ap - d_an + margin)
    # "average only over the triplets that still violate the margin" (FaceNet-style)
    n_active = (losses > 0).sum()
    return losses.sum() / n_active, n_active


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--triplets", type=int, default=48)
    p.add_argument("--margin", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=3e-3)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    n_classes, per_class, d = 8, 200, 24
    centers = 1.0 * torch.randn(n_classes, d, generator=gen)
    x = centers.repeat_interleave(per_class, 0) + torch.randn(n_classes * per_class, d, generator=gen)
    labels = torch.arange(n_classes).repeat_interleave(per_class)
    by_class = [torch.nonzero(labels == c).flatten().tolist() for c in range(n_classes)]

    model = Embedder(d, 16)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    trip_gen = torch.Generator().manual_seed(3)
    for step in range(args.steps):
        ia, ip, ineg = sample_triplets(by_class, args.triplets, trip_gen)
        emb = model(torch.cat([x[ia], x[ip], x[ineg]]))
        ea, ep, en = emb.split(args.triplets)
        loss, n_active = triplet_loss_active_mean(ea, ep, en, args.margin)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 5 == 0:
            print(f"step {step:4d} loss {loss.item():.4f} active triplets {n_active.item()}/{args.triplets}")


if __name__ == "__main__":
    main()
