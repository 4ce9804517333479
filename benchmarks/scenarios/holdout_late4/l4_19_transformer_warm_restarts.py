# expect: {"healthy": true}
# about: held out (round late 4): a tiny Transformer encoder classifier trained for 900 steps with AdamW and cosine warm restarts every 150 steps, showing loss and gradient-norm spikes after restarts (clipped at 1.0) that recover, all finite.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class TinyEncoderClassifier(nn.Module):
    def __init__(self, vocab=12, d_model=32, n_heads=2, n_layers=2, seq_len=16, n_classes=3):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(0.02 * torch.randn(seq_len, d_model))
        layer = nn.TransformerEncoderLayer(d_model, n_heads, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.cls = nn.Linear(d_model, n_classes)

    def forward(self, tokens):
        h = self.tok(tokens) + self.pos
        h = self.encoder(h)
        return self.cls(h.mean(1))


def make_batch(n, gen, vocab=12, seq_len=16):
    tokens = torch.randint(0, vocab, (n, seq_len), generator=gen)
    # label: which of tokens 1, 2, 3 occurs most often (ties -> lowest id)
    counts = torch.stack([(tokens == k).sum(1) for k in (1, 2, 3)], 1)
    return tokens, counts.argmax(1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=900)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=4e-3)
    p.add_argument("--cycle", type=int, default=150)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    model = TinyEncoderClassifier()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=args.cycle, eta_min=1e-5)
    for step in range(args.steps):
        tokens, labels = make_batch(args.batch_size, gen)
        logits = model(tokens)
        loss = F.cross_entropy(logits, labels)
        opt.zero_grad()
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 25 == 0 or step % args.cycle in (1, 2, 3):
            print(f"step {step:4d} lr {sched.get_last_lr()[0]:.2e} loss {loss.item():.4f} grad norm {gnorm.item():.3f}")


if __name__ == "__main__":
    main()
