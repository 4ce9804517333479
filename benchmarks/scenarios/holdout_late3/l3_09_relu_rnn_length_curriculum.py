# expect: {"cause": "exploding-gradients", "phase": "forward", "op": "aten.addmm.default", "module": "rnn"}
# about: held out (round late 3): an identity-initialised ReLU RNN (IRNN) trained with SGD+momentum and no gradient clipping on a sequence-length curriculum (10 + step); gradients grow with the length, a large update pushes the recurrent matrix past spectral radius 1, and the hidden state overflows to inf inside the RNN in the forward pass at step 165.
import argparse

import torch
import torch.nn as nn


class SumRNN(nn.Module):
    """Reads a sequence of numbers and predicts their total at the end."""

    def __init__(self, hidden=32):
        super().__init__()
        self.rnn = nn.RNN(input_size=2, hidden_size=hidden, nonlinearity="relu", batch_first=True)
        self.readout = nn.Linear(hidden, 1)
        # IRNN initialisation (Le et al., 2015): identity recurrence, zero bias
        nn.init.eye_(self.rnn.weight_hh_l0)
        nn.init.zeros_(self.rnn.bias_hh_l0)
        nn.init.zeros_(self.rnn.bias_ih_l0)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.readout(out[:, -1]).squeeze(-1)


def make_batch(batch, length, g):
    # a stream of daily amounts (with a flag for weekend days); predict the total
    vals = torch.rand(batch, length, generator=g)
    weekend = ((torch.arange(length) % 7) >= 5).float().expand(batch, length)
    vals = vals * (1 + weekend)
    target = vals.sum(1) / 10  # in tens
    return torch.stack([vals, weekend], dim=-1), target


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=250)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--batch", type=int, default=32)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    model = SumRNN()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    crit = nn.MSELoss()

    for step in range(args.steps):
        # curriculum: sequences get longer as training goes on
        length = 10 + step
        x, target = make_batch(args.batch, length, g)
        pred = model(x)
        loss = crit(pred, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 25 == 0:
            print(f"step {step:4d} len {length:4d} loss {loss.item():.4f}")
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
