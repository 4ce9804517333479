# expect: {"healthy": true}
# about: a two-layer LSTM sequence classifier with packed variable-length sequences and gradient clipping at 1.0.
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

torch.manual_seed(0)
torch.set_num_threads(1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(3, 32, num_layers=2, batch_first=True)
        self.head = nn.Linear(32, 2)

    def forward(self, x, lengths):
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        _, (h, _) = self.lstm(packed)
        return self.head(h[-1])


x_all = torch.randn(512, 25, 3)
lengths_all = torch.randint(5, 26, (512,))
y_all = (x_all[:, :5, 0].sum(1) > 0).long()
model = Net()
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
for step in range(40):
    idx = torch.randint(0, 512, (16,))
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x_all[idx], lengths_all[idx]), y_all[idx])
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    if step % 10 == 0:
        print(f"step {step} loss {loss.item():.4f}")
