# expect: {"cause": "low-precision-overflow", "phase": "forward", "op": "aten.exp.default", "module": ""}
# about: held out (round late): a 10-class MLP classifier kept in .half() with a hand-written softmax exp(logits)/sum; as training makes the classifier confident the largest logits pass ~11.1 and exp overflows float16 at step 51.
import torch
import torch.nn as nn

torch.manual_seed(5)
torch.set_num_threads(1)

# 10-class classification of noisy prototypes; the model is kept in half precision
# to save memory ("it's a small model, fp16 is fine").
N, D, C = 6000, 48, 10
protos = torch.randn(C, D)
labels = torch.randint(0, C, (N,))
X = protos[labels] + 0.8 * torch.randn(N, D)


class SoftmaxClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Linear(D, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU())
        self.classifier = nn.Linear(128, C)

    def forward(self, x):
        logits = self.classifier(self.features(x))
        e = torch.exp(logits)
        return e / e.sum(dim=1, keepdim=True)


model = SoftmaxClassifier().half()
optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
batch_size = 128

for step in range(300):
    idx = torch.randint(0, N, (batch_size,))
    xb, yb = X[idx].half(), labels[idx]
    probs = model(xb)
    loss = -torch.log(probs[torch.arange(batch_size), yb] + 1e-4).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 10 == 0:
        acc = (probs.argmax(1) == yb).float().mean()
        print(f"step {step:4d}  loss {loss.item():.4f}  acc {acc.item():.3f}")
