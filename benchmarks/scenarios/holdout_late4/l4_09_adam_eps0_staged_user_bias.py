# expect: {"cause": "optimizer-state", "phase": "optimizer", "op": "aten.addcdiv_.default", "module": "user_bias"}
# about: held out (round late 4): a rating model trained with Adam(eps=0) whose per-user bias embedding is only switched on once the loss EMA drops below a threshold (step 121); on its first Adam step the rows of users absent from the batch have zero gradient and zero state, so exp_avg/sqrt(exp_avg_sq) = 0/0 writes NaN into user_bias.weight at step 122 (aten.addcdiv_).
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class RatingModel(nn.Module):
    """Content-based rating predictor; per-user offsets are switched on once the shared part has converged."""

    def __init__(self, d_user, d_item, n_users, hidden=64):
        super().__init__()
        self.user_tower = nn.Sequential(nn.Linear(d_user, hidden), nn.GELU())
        self.item_tower = nn.Sequential(nn.Linear(d_item, hidden), nn.GELU())
        self.scorer = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.GELU(), nn.Linear(hidden, 1))
        self.user_bias = nn.Embedding(n_users, 1)
        nn.init.zeros_(self.user_bias.weight)
        self.use_user_bias = False

    def forward(self, uid, u_feat, i_feat):
        h = torch.cat([self.user_tower(u_feat), self.item_tower(i_feat)], dim=-1)
        score = self.scorer(h).squeeze(-1)
        if self.use_user_bias:
            score = score + self.user_bias(uid).squeeze(-1)
        return score


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--stage2-threshold", type=float, default=0.8)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    n_users, n_items, d_u, d_i = 800, 300, 10, 12
    user_feat = torch.randn(n_users, d_u, generator=gen)
    item_feat = torch.randn(n_items, d_i, generator=gen)
    a = torch.randn(d_u, 4, generator=gen) / d_u ** 0.5
    b = torch.randn(d_i, 4, generator=gen) / d_i ** 0.5
    user_offset = 0.5 * torch.randn(n_users, generator=gen)

    def ratings(uid, iid):
        base = ((user_feat[uid] @ a) * (item_feat[iid] @ b)).sum(-1)
        return base + user_offset[uid]

    model = RatingModel(d_u, d_i, n_users)
    # eps=0: "we don't want a fudge factor in the denominator"
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, eps=0.0)
    batch_gen = torch.Generator().manual_seed(1)
    ema = None
    for step in range(args.steps):
        uid = torch.randint(0, n_users, (args.batch_size,), generator=batch_gen)
        iid = torch.randint(0, n_items, (args.batch_size,), generator=batch_gen)
        target = ratings(uid, iid) + 0.1 * torch.randn(args.batch_size, generator=batch_gen)
        pred = model(uid, user_feat[uid], item_feat[iid])
        loss = F.mse_loss(pred, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        if not model.use_user_bias and ema < args.stage2_threshold:
            print(f"step {step}: shared model converged (ema {ema:.3f}), enabling per-user offsets")
            model.use_user_bias = True
        if step % 20 == 0:
            print(f"step {step:4d} loss {loss.item():.4f} ema {ema:.4f}")


if __name__ == "__main__":
    main()
