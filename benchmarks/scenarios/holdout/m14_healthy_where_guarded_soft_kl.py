# expect: {"healthy": true}
# about: held out (round 4, modern stack): written by someone who had not read the code. HEALTHY control with a deliberate log(0) and NaN in the forward. An MLP classifier (LayerNorm, GELU, SGD Nesterov) trained on crowd-sourced soft labels (vote histograms of 5 annotators, so most class probabilities are exactly 0) with a hand-written KL(target || q): term = target * (log(target) - log_softmax(logits)), then torch.where(target > 0, term, 0).sum(). For zero targets aten.log.default gives -inf and the product 0 * -inf gives NaN in every step, but torch.where drops them; the target does not require grad, and the gradient reaching log_softmax is target * (where-grad) = 0 there, so no gradient, weight or loss is ever non-finite (checked over all 100 steps: the -inf/NaN are read only by sub, mul and the where). KL falls 1.71 -> ~0.85, accuracy ~0.9, so nothing should be reported.
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
torch.set_num_threads(1)

N_CLS, D = 10, 24


def soft_labels(y, n_annot=5):
    """crowd-sourced labels: each image was labelled by 5 annotators; the target is the vote
    histogram, so most classes have probability exactly 0"""
    votes = torch.where(torch.rand(y.shape[0], n_annot) < 0.7, y[:, None],
                        torch.randint(0, N_CLS, (y.shape[0], n_annot)))
    return F.one_hot(votes, N_CLS).float().mean(1)


def kl_div_soft(logits, target):
    """KL(target || softmax(logits)) with the 0 * log 0 = 0 convention"""
    logq = F.log_softmax(logits, dim=-1)
    term = target * (torch.log(target) - logq)         # log(0) = -inf and 0 * -inf = NaN where target == 0 ...
    return torch.where(target > 0, term, torch.zeros_like(term)).sum(-1).mean()   # ... which are dropped here


W_true = torch.randn(D, N_CLS)
model = nn.Sequential(nn.Linear(D, 64), nn.LayerNorm(64), nn.GELU(), nn.Linear(64, N_CLS))
opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9, nesterov=True)
for step in range(100):
    x = torch.randn(128, D)
    y = (x @ W_true).argmax(1)
    target = soft_labels(y)
    loss = kl_div_soft(model(x), target)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 20 == 0 or step == 99:
        acc = (model(x).argmax(1) == y).float().mean().item()
        print(f"step {step:3d} kl {loss.item():.4f} acc {acc:.3f}")
