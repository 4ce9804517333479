# expect: {"cause": "exploding-gradients", "phase": "backward", "op": "aten.mm.default", "module": "cell.rec"}
# about: held out (round late 5): trains a hand-unrolled tanh Elman RNN (orthogonal recurrent init, gain 3) on a delayed-recall task with full BPTT, a sequence-length curriculum (10 + 4 per step) and clip_grad_value_ after backward; the forward stays bounded but the backpropagated gradient grows exponentially with length and at step 90 the backward mm through cell.rec overflows to Inf.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class ElmanCell(nn.Module):
    def __init__(self, d_in, d_hidden, recurrent_gain):
        super().__init__()
        self.inp = nn.Linear(d_in, d_hidden)
        self.rec = nn.Linear(d_hidden, d_hidden, bias=False)
        # large orthogonal recurrent init so information survives long sequences
        nn.init.orthogonal_(self.rec.weight, gain=recurrent_gain)

    def forward(self, x_t, h):
        return torch.tanh(self.inp(x_t) + self.rec(h))


class DelayRecallRNN(nn.Module):
    def __init__(self, d_in, d_hidden, recurrent_gain):
        super().__init__()
        self.cell = ElmanCell(d_in, d_hidden, recurrent_gain)
        self.readout = nn.Linear(d_hidden, d_in)
        self.d_hidden = d_hidden

    def forward(self, x):
        b, t, _ = x.shape
        h = x.new_zeros(b, self.d_hidden)
        outs = []
        for i in range(t):                       # unrolled by hand for full BPTT
            h = self.cell(x[:, i], h)
            outs.append(self.readout(h))
        return torch.stack(outs, 1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--start-len", type=int, default=10)
    p.add_argument("--len-step", type=int, default=4, help="sequence length added per training step")
    p.add_argument("--delay", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.002)
    p.add_argument("--clip", type=float, default=0.5)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    d_in = 4
    model = DelayRecallRNN(d_in, 48, recurrent_gain=3.0)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    for step in range(args.steps):
        seq_len = args.start_len + args.len_step * step       # length curriculum
        x = torch.randn(args.batch_size, seq_len, d_in, generator=gen)
        target = torch.zeros_like(x)
        target[:, args.delay:] = x[:, :-args.delay]
        pred = model(x)
        loss = F.mse_loss(pred, target)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_value_(model.parameters(), args.clip)
        opt.step()
        if step % 10 == 0:
            print(f"step {step:4d} len {seq_len:4d} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
