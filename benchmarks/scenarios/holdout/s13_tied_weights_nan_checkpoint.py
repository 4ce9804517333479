# expect: {"cause": "nonfinite-parameters", "phase": "forward", "op": "parameter", "module": "embed"}
# about: held out: written after the suite by someone who had not read it. Fine-tuning a small weight-tied LM (decoder.weight is embed.weight) from a checkpoint.
# Fine-tuning a small weight-tied LM (decoder.weight is embed.weight) from a checkpoint.
# The checkpoint went through a conversion script that cloned every tensor (so the two tied
# entries are stored separately) and one element of "decoder.weight" is NaN. load_state_dict
# copies "embed.weight" and then "decoder.weight" into the same shared Parameter.
import io

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
V, D, T = 120, 48, 16


class TiedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.rnn = nn.GRU(D, D, batch_first=True)
        self.norm = nn.LayerNorm(D)
        self.decoder = nn.Linear(D, V, bias=False)
        self.decoder.weight = self.embed.weight          # weight tying

    def forward(self, x):
        h, _ = self.rnn(self.embed(x))
        return self.decoder(self.norm(h))


# --- the "pretrained" checkpoint (built here; normally torch.load("ckpt.pt")) ---
pre = TiedLM()
sd = {k: v.detach().clone() for k, v in pre.state_dict().items()}   # "convert" step
sd["decoder.weight"][37, 5] = float("nan")
buf = io.BytesIO()
torch.save(sd, buf)
buf.seek(0)

# --- fine-tuning script ---
model = TiedLM()
model.load_state_dict(torch.load(buf))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
data = torch.randint(0, V, (64, T + 1))
for step in range(10):
    x, y = data[:, :-1], data[:, 1:]
    loss = F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}")
