# expect: {"cause": "optimizer-state", "phase": "optimizer", "op": ["aten.addcdiv_.default", "aten._foreach_addcdiv_.Scalar"], "module": [null, "embed_num"]}
# guess before tracer: Adagrad update param.addcdiv_(grad, state_sum.sqrt() + eps) with eps=0: the weight column of a feature that is always 0 has grad 0 and state_sum 0 -> 0/0 = NaN at step 0 reftrace: aten.addcdiv_.default, optimizer, step 0.
# about: held out (round 3): written after the code by someone who had not read it or the suite. a click-through model: numeric features (one of them, "discount", is all zeros in this export) go through Linear embed_num, categorical ids through an EmbeddingBag; trained with Adagrad(lr=0.05, eps=0) "to match the paper's formula".
import torch
from torch import nn

torch.manual_seed(10)
torch.set_num_threads(1)


class CTR(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_num = nn.Linear(6, 16)
        self.embed_cat = nn.EmbeddingBag(50, 16, mode="mean")
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(16, 1))

    def forward(self, num, cat):
        return self.head(self.embed_num(num) + self.embed_cat(cat)).squeeze(1)


num = torch.randn(1024, 6)
num[:, 4] = 0.0  # "discount" column: all zeros in this export
cat = torch.randint(0, 50, (1024, 3))
y = ((num[:, 0] + (cat[:, 0] % 2).float()) > 0.5).float()
model = CTR()
opt = torch.optim.Adagrad(model.parameters(), lr=0.05, eps=0.0)
for step in range(50):
    s = slice(step * 64 % 1024, step * 64 % 1024 + 64)
    opt.zero_grad()
    loss = nn.functional.binary_cross_entropy_with_logits(model(num[s], cat[s]), y[s])
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4g}")
