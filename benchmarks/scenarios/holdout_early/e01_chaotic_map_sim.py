# expect: {"cause": "exploding-gradients", "phase": "backward", "op": "aten.mul.Tensor", "module": "dynamics"}
# about: held out (round early): A grey-box logistic-map population simulator is fit by backprop through full rollouts of recordings of 48, 64 or 300 steps; the learned map is chaotic, so BPTT gradients grow exponentially with rollout length and the first 300-step batch (step 8) overflows the gradient to inf/nan in backward while the loss is still finite.
import torch
import torch.nn as nn

torch.manual_seed(0)
torch.set_num_threads(1)

# ---- synthetic field recordings: insect population following the logistic map (r = 3.9, chaotic) ----
# recordings come in three durations; batches are formed from recordings of equal length.
R_TRUE = 3.9


def logistic_rollout(x0, steps, r=R_TRUE):
    xs = [x0]
    x = x0
    for _ in range(steps):
        x = r * x * (1 - x)
        xs.append(x)
    return torch.stack(xs, 1)


recordings = []                      # list of (N, L+1, 1) tensors
for n_rec, length in [(40, 48), (24, 64), (8, 300)]:
    x0 = 0.2 + 0.6 * torch.rand(n_rec, 1)
    traj = logistic_rollout(x0, length)
    recordings.append(traj + 0.002 * torch.randn_like(traj))

BATCH = 8
batches = []
for traj in recordings:
    for i in range(0, traj.shape[0], BATCH):
        batches.append(traj[i:i + BATCH])


class HybridStep(nn.Module):
    """One simulator step: logistic growth with a learnable rate plus a small neural correction."""

    def __init__(self, hid=16):
        super().__init__()
        self.rate = nn.Parameter(torch.tensor(3.7))      # prior from the literature
        self.correction = nn.Sequential(nn.Linear(1, hid), nn.Tanh(), nn.Linear(hid, 1))
        nn.init.zeros_(self.correction[2].weight)
        nn.init.zeros_(self.correction[2].bias)

    def forward(self, x):
        return self.rate * x * (1 - x) + 0.01 * self.correction(x)


class PopulationSim(nn.Module):
    def __init__(self):
        super().__init__()
        self.dynamics = HybridStep()

    def forward(self, x0, n_steps):
        x = x0
        preds = [x]
        for t in range(n_steps):                   # roll the simulator out by hand
            x = self.dynamics(x)
            preds.append(x)
        return torch.stack(preds, 1)


sim = PopulationSim()
opt = torch.optim.Adam(sim.parameters(), lr=0.01)

step = 0
for epoch in range(4):
    order = torch.randperm(len(batches))
    for bi in order.tolist():
        obs = batches[bi]
        preds = sim(obs[:, 0], obs.shape[1] - 1)   # simulate over the whole recording
        loss = ((preds - obs) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"epoch {epoch} step {step:3d}  len {obs.shape[1]:3d}  rollout-mse {loss.item():.5f}  "
              f"|grad rate| {sim.dynamics.rate.grad.abs().item():.3e}  rate {sim.dynamics.rate.item():.4f}")
        step += 1
