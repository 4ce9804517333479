# expect: {"cause": "bad-initialization", "phase": "forward", "op": "aten.addmm.default", "module": "cell"}
# about: held out (round early): A ReLU nn.RNNCell review classifier (LayerNorm before the head) has every weight initialised N(0, 0.12), making the 256-unit recurrence expansive (about x1.3 per step); short reviews train fine, but the first batch holding a ~400-token review (step 9) overflows the hidden state to inf in the cell (default init stays finite).
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(6)
torch.set_num_threads(1)

# ---- synthetic "reviews": token sequences of varying length; label = more positive than negative tokens ----
VOCAB = 50                                                 # tokens 1-5 positive, 6-10 negative
N = 640
lengths = torch.randint(10, 60, (N,))
long_reviews = torch.randperm(N)[:3]                      # a few very long reviews
lengths[long_reviews] = torch.randint(300, 300 + 200, (3,))
seqs = [torch.randint(1, VOCAB, (int(L),)) for L in lengths]
labels = torch.tensor([int(sum((s < 6).tolist()) > sum(((s >= 6) & (s < 11)).tolist())) for s in seqs])

BATCH = 32


class RNNClassifier(nn.Module):
    def __init__(self, hid=256):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 32, padding_idx=0)
        self.cell = nn.RNNCell(32, hid, nonlinearity="relu")
        self.norm = nn.LayerNorm(hid)
        self.head = nn.Linear(hid, 2)

    def forward(self, x, lens):
        h = x.new_zeros(x.shape[0], self.cell.hidden_size, dtype=torch.float)
        e = self.emb(x)
        for t in range(x.shape[1]):
            h_new = self.cell(e[:, t], h)
            keep = (t < lens).float().unsqueeze(1)          # freeze the state after each sequence ends
            h = keep * h_new + (1 - keep) * h
        return self.head(self.norm(h))


model = RNNClassifier()
for name, p in model.named_parameters():                  # "small random" init for every weight matrix
    if "weight" in name and "norm" not in name:
        nn.init.normal_(p, 0.0, 0.12)
    elif "norm" not in name:
        nn.init.zeros_(p)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)

for step in range(40):
    if step % (N // BATCH) == 0:
        perm = torch.randperm(N)                           # reshuffle every epoch
    b = step % (N // BATCH)
    idx = perm[b * BATCH:(b + 1) * BATCH]
    lens = lengths[idx]
    x = torch.zeros(len(idx), int(lens.max()), dtype=torch.long)
    for j, i in enumerate(idx):
        x[j, :lens[j]] = seqs[int(i)]
    logits = model(x, lens)
    loss = F.cross_entropy(logits, labels[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step:3d}  max len {int(lens.max()):3d}  loss {loss.item():.4g}")
