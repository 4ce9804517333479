# expect: {"cause": "nonfinite-input", "phase": "data", "op": "input", "module": null}
# label in the suite's convention for data (phase "data", op "input", no module); its author wrote phase "input", op aten.addmm.default, module embed: the first op that reads the NaN frame
# about: held out (round early): A latent-ODE model (GRUCell encoder run backwards, hand-written Euler solver, linear decoder) is fit to motion-capture pendulum logs in which one dropped frame was written as NaN; the batch holding that recording arrives at step 7 and the NaN flows from the input through the model, making the loss, gradients and weights NaN.
import math
import torch
import torch.nn as nn

torch.manual_seed(0)
torch.set_num_threads(1)

# ---- synthetic motion-capture logs of damped pendulums: (angle, angular velocity) every 0.1 s ----
N, T_OBS, T_PRED, DT = 320, 20, 40, 0.1


def simulate(n):
    theta = (torch.rand(n) - 0.5) * 2.0
    omega = (torch.rand(n) - 0.5) * 1.0
    damp = 0.1 + 0.2 * torch.rand(n)
    out = []
    for _ in range(T_PRED):
        out.append(torch.stack([theta, omega], 1))
        for _ in range(10):                                   # fine-grained ground-truth integration
            acc = -9.81 * torch.sin(theta) - damp * omega
            omega = omega + 0.01 * acc
            theta = theta + 0.01 * omega
    return torch.stack(out, 1)


logs = simulate(N) + 0.01 * torch.randn(N, T_PRED, 2)
# the tracker occasionally drops a marker; dropped frames were written to the log as NaN
logs[161, 12] = float("nan")
windows = logs[:, :T_OBS].clone()                             # what the model gets to see


class LatentODE(nn.Module):
    def __init__(self, latent=16, hid=64):
        super().__init__()
        self.embed = nn.Linear(2, 32)
        self.encoder = nn.GRUCell(32, hid)
        self.to_z0 = nn.Linear(hid, latent)
        self.dynamics = nn.Sequential(nn.Linear(latent, hid), nn.Tanh(), nn.Linear(hid, latent))
        self.decoder = nn.Linear(latent, 2)

    def forward(self, obs):
        e = self.embed(obs)
        h = obs.new_zeros(obs.shape[0], self.encoder.hidden_size)
        for t in reversed(range(obs.shape[1])):               # encode the observed window backwards in time
            h = self.encoder(e[:, t], h)
        z = self.to_z0(h)
        zs = []
        for _ in range(T_PRED):                               # explicit Euler solver
            zs.append(z)
            z = z + DT * self.dynamics(z)
        return self.decoder(torch.stack(zs, 1))


model = LatentODE()
opt = torch.optim.Adam(model.parameters(), lr=3e-3)

step = 0
for epoch in range(6):
    perm = torch.randperm(N)
    for i in range(0, N, 32):
        idx = perm[i:i + 32]
        batch = logs[idx]
        pred = model(windows[idx])
        loss = ((pred - batch) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"epoch {epoch} step {step:3d} loss {loss.item():.5f}")
        step += 1
