# expect: {"healthy": true}
# about: held out (round late): logistic regression on bag-of-words counts with weights and bias initialised to exactly zero, plain SGD; trains normally, all finite.
import torch
import torch.nn as nn

torch.manual_seed(20)
torch.set_num_threads(1)

# spam-filter style logistic regression on bag-of-words counts
N, V = 3000, 200
rates = torch.rand(V) * 0.5
X = torch.poisson(rates.expand(N, V))
w_true = torch.randn(V) * (torch.rand(V) < 0.1).float() * 2.0
y = (torch.sigmoid(X @ w_true - 0.2) > torch.rand(N)).float()


class LogisticRegression(nn.Module):
    def __init__(self, n_features):
        super().__init__()
        self.linear = nn.Linear(n_features, 1)
        nn.init.zeros_(self.linear.weight)   # convex problem: start from w = 0
        nn.init.zeros_(self.linear.bias)

    def forward(self, x):
        return self.linear(x).squeeze(1)


model = LogisticRegression(V)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
criterion = nn.BCEWithLogitsLoss()
batch_size = 64

for step in range(400):
    idx = torch.randint(0, N, (batch_size,))
    logits = model(X[idx])
    loss = criterion(logits, y[idx])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 20 == 0:
        acc = ((logits > 0).float() == y[idx]).float().mean()
        print(f"step {step:4d}  loss {loss.item():.4f}  acc {acc.item():.3f}  |w| {model.linear.weight.norm().item():.3f}")
