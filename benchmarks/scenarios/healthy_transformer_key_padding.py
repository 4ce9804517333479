# expect: {"healthy": true}
# about: nn.TransformerEncoder with src_key_padding_mask over variable-length sequences (every sequence has at least one real token), mean-pooled over the real tokens.
import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)

VOCAB, D, PAD, T = 60, 32, 0, 14


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D, padding_idx=PAD)
        layer = nn.TransformerEncoderLayer(D, 4, 64, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(D, 2)

    def forward(self, tokens):
        pad = tokens == PAD
        h = self.encoder(self.embed(tokens), src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).float()
        return self.head((h * keep).sum(1) / keep.sum(1))


lengths = torch.randint(2, T + 1, (640,))
tokens = torch.randint(1, VOCAB, (640, T))
tokens[torch.arange(T)[None, :] >= lengths[:, None]] = PAD
labels = (tokens[:, 0] > VOCAB // 2).long()

model = Classifier()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(40):
    tb, yb = tokens[step * 16:(step + 1) * 16], labels[step * 16:(step + 1) * 16]
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(tb), yb)
    loss.backward()
    optimizer.step()
    if step % 10 == 0:
        print(f"step {step} loss {loss.item():.4f}")
