# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.log.default", "module": ""}
# about: held out (round late 5): trains a wide-and-deep CTR model with Adagrad on nearly deterministic click logs using a hand-written BCE -(y log p + (1-y) log(1-p)) outside the model; as the logits grow one passes ~17 at step 66, sigmoid rounds to exactly 1 and log(1 - p) returns -Inf.
import argparse

import torch
import torch.nn as nn


class WideAndDeep(nn.Module):
    def __init__(self, n_fields, vocab, emb_dim=8, hidden=32):
        super().__init__()
        self.wide = nn.Embedding(n_fields * vocab, 1)
        self.emb = nn.Embedding(n_fields * vocab, emb_dim)
        self.deep = nn.Sequential(
            nn.Linear(n_fields * emb_dim, hidden), nn.ReLU(),
            nn.Linear(hidden, 1),
        )
        self.register_buffer("offsets", torch.arange(n_fields) * vocab)

    def forward(self, ids):
        ids = ids + self.offsets
        wide = self.wide(ids).sum(dim=(1, 2))
        deep = self.deep(self.emb(ids).flatten(1)).squeeze(1)
        return wide + deep


def click_log(n, n_fields, vocab, gen):
    ids = torch.randint(0, vocab, (n, n_fields), generator=gen)
    field_w = torch.randn(n_fields, vocab, generator=gen) * 1.5
    score = field_w.gather(1, ids.t()).t().sum(1)
    clicked = (score > 0).float()  # clean, nearly deterministic logs
    return ids, clicked


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.1)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    n_fields, vocab = 6, 50
    ids, clicked = click_log(20000, n_fields, vocab, gen)

    model = WideAndDeep(n_fields, vocab)
    opt = torch.optim.Adagrad(model.parameters(), lr=args.lr)

    for step in range(args.steps):
        idx = torch.randint(0, ids.shape[0], (args.batch_size,), generator=gen)
        x, y = ids[idx], clicked[idx]
        p_click = torch.sigmoid(model(x))
        loss = -(y * torch.log(p_click) + (1 - y) * torch.log(1 - p_click)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0:
            acc = ((p_click > 0.5).float() == y).float().mean().item()
            print(f"step {step:4d} logloss {loss.item():.4f} acc {acc:.3f}")


if __name__ == "__main__":
    main()
