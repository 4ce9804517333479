# expect: {"cause": "low-precision-overflow", "phase": "forward", "op": "aten.exp.default", "module": ""}
# about: held out (round late 3): an MLP classifier converted with .half() and trained with SGD+momentum through a hand-written softmax cross-entropy; the logits grow as the blobs get separated until exp(logits) exceeds the float16 max (logit > ~11.1) and gives inf in the loss function (forward) at step 150.
import argparse

import torch
import torch.nn as nn


class BlobClassifier(nn.Module):
    def __init__(self, d_in=20, hidden=64, n_classes=10):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, n_classes)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.out(self.act(self.fc2(self.act(self.fc1(x)))))


def softmax_cross_entropy(logits, target):
    e = torch.exp(logits)
    probs = e / e.sum(dim=1, keepdim=True)
    return -torch.log(probs.gather(1, target[:, None])).mean()


def make_data(n=4096, d=20, k=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    centres = 2.0 * torch.randn(k, d, generator=g)
    y = torch.randint(0, k, (n,), generator=g)
    x = centres[y] + torch.randn(n, d, generator=g)
    return x, y


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=0.005)
    p.add_argument("--batch", type=int, default=128)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    x, y = make_data()
    x = x.half()
    model = BlobClassifier().half()  # half precision to save memory
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    n = x.shape[0]
    for step in range(args.steps):
        idx = torch.arange(step * args.batch, (step + 1) * args.batch) % n
        logits = model(x[idx])
        loss = softmax_cross_entropy(logits, y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 20 == 0:
            print(f"step {step:4d} loss {loss.item():.4f}")
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
