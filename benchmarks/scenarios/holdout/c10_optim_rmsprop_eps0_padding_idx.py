# expect: {"cause": "optimizer-state", "phase": "optimizer", "op": ["aten.addcdiv_.default", "aten._foreach_addcdiv_.Scalar"], "module": [null, "emb"]}
# guess before tracer: RMSprop update param.addcdiv_(grad, square_avg.sqrt() + eps) with eps=0; the padding_idx row of the embedding always has grad 0 -> 0/0 = NaN at step 0 (also unused vocab rows) reftrace: aten.addcdiv_.default, optimizer, step 0.
# about: held out (round 3): written after the code by someone who had not read it or the suite. a 1-D CNN text classifier over padded token ids with nn.Embedding(padding_idx=0) trained with RMSprop(lr=1e-3, eps=0, centered=False); the padding row's gradient is exactly 0 by design.
import torch
from torch import nn

torch.manual_seed(11)
torch.set_num_threads(1)


class TextCNN(nn.Module):
    def __init__(self, vocab=200, d=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d, padding_idx=0)
        self.conv = nn.Conv1d(d, 64, 5, padding=2)
        self.fc = nn.Linear(64, 3)

    def forward(self, ids):
        h = self.conv(self.emb(ids).transpose(1, 2)).relu()
        return self.fc(h.max(dim=2).values)


lengths = torch.randint(5, 40, (512,))
ids = torch.randint(1, 200, (512, 40))
ids[torch.arange(40)[None, :] >= lengths[:, None]] = 0
y = (ids[:, 0] % 3)
model = TextCNN()
opt = torch.optim.RMSprop(model.parameters(), lr=1e-3, eps=0.0)
for step in range(40):
    s = slice(step * 32 % 512, step * 32 % 512 + 32)
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(ids[s]), y[s])
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4g}")
