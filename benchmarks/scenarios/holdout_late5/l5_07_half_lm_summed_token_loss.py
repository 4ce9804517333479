# expect: {"cause": "low-precision-overflow", "phase": "forward", "op": "aten.nll_loss_forward.default", "module": ""}
# about: held out (round late 5): trains a .half() next-token model on a synthetic Markov text source with a context-length curriculum (64 + 12 tokens per step) and a token-summed cross-entropy computed outside the model; the float16 summed loss grows with the context and passes 65504 at step 85, where nll_loss returns Inf.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class TinyCharLM(nn.Module):
    def __init__(self, vocab, d_emb=16, d_hidden=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d_emb)
        self.mix = nn.Sequential(nn.Linear(2 * d_emb, d_hidden), nn.ReLU())
        self.out = nn.Linear(d_hidden, vocab)

    def forward(self, tokens):
        e = self.emb(tokens)
        prev = torch.cat([torch.zeros_like(e[:, :1]), e[:, :-1]], dim=1)
        return self.out(self.mix(torch.cat([e, prev], dim=-1)))


class MarkovSource:
    """Second-order Markov 'text' with a peaked transition table."""

    def __init__(self, vocab, gen):
        self.vocab, self.gen = vocab, gen
        self.table = torch.softmax(torch.randn(vocab, vocab, vocab, generator=gen) * 2.5, dim=-1)

    def corpus(self, n_streams, length):
        out = torch.empty(n_streams, length, dtype=torch.long)
        out[:, :2] = torch.randint(0, self.vocab, (n_streams, 2), generator=self.gen)
        for t in range(2, length):
            probs = self.table[out[:, t - 2], out[:, t - 1]]
            out[:, t] = torch.multinomial(probs, 1, generator=self.gen).squeeze(1)
        return out


def get_batch(corpus, bs, length, gen):
    rows = torch.randint(0, corpus.shape[0], (bs,), generator=gen)
    starts = torch.randint(0, corpus.shape[1] - length, (bs,), generator=gen)
    idx = starts[:, None] + torch.arange(length)
    return corpus[rows[:, None], idx]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=130)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--start-len", type=int, default=64)
    p.add_argument("--len-growth", type=int, default=12, help="tokens added to the context each step")
    p.add_argument("--lr", type=float, default=0.2)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    vocab = 48
    corpus = MarkovSource(vocab, gen).corpus(64, 4096)
    model = TinyCharLM(vocab).half()           # half precision to fit longer contexts
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    for step in range(args.steps):
        seq_len = args.start_len + args.len_growth * step    # length curriculum
        batch = get_batch(corpus, args.batch_size, seq_len + 1, gen)
        inp, tgt = batch[:, :-1], batch[:, 1:]
        logits = model(inp)
        # sum over tokens (long documents should weigh more), mean over documents
        loss = F.cross_entropy(logits.reshape(-1, vocab), tgt.reshape(-1), reduction="sum") / args.batch_size
        opt.zero_grad()
        (loss / seq_len).backward()
        opt.step()
        if step % 20 == 0:
            print(f"step {step:4d} len {seq_len:5d} loss/doc {loss.item():.1f} per-token {loss.item() / seq_len:.3f}")


if __name__ == "__main__":
    main()
