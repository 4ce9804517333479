# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": ["aten.mean.default", "aten.pow.Tensor_Scalar"], "module": ""}
# about: held out (round late): linear regression on unstandardised features with 4-step gradient accumulation where the micro-batch losses are not divided by accum_steps, so the effective lr is 4x the tuned one and sits just past the stability limit; the loss grows geometrically and the squared-error mean overflows to inf at step 251.
import torch
import torch.nn as nn

torch.manual_seed(1)
torch.set_num_threads(1)

# tabular regression: raw (unstandardised) sensor features with very different scales
N, D = 8192, 12
scales = torch.linspace(0.5, 6.0, D)
X = torch.randn(N, D) * scales
w_true = torch.randn(D) / scales
y = (X @ w_true + 0.3 * torch.randn(N)).unsqueeze(1)

model = nn.Linear(D, 1)

# lr was tuned for batch size 32 without accumulation
lr = 0.0075
accum_steps = 4
micro_bs = 32
optimizer = torch.optim.SGD(model.parameters(), lr=lr)

def batches():
    while True:
        perm = torch.randperm(N)
        for i in range(0, N - micro_bs + 1, micro_bs):
            idx = perm[i:i + micro_bs]
            yield X[idx], y[idx]

data = batches()
for step in range(300):
    optimizer.zero_grad()
    running = 0.0
    for _ in range(accum_steps):
        xb, yb = next(data)
        pred = model(xb)
        loss = ((pred - yb) ** 2).mean()
        loss.backward()          # gradients from each micro-batch are summed
        running += loss.item()
    optimizer.step()
    if step % 10 == 0:
        print(f"step {step:4d}  loss {running / accum_steps:.4e}")
