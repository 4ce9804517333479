# expect: {"healthy": true}
# about: held out (round 3): written after the code by someone who had not read it or the suite. control (not planned as one): a conv autoencoder trained with Adam(lr=1.0); I expected weights to grow until an overflow, but Adam moves each weight by ~lr per step (linear, not geometric growth): the loss jumps to 6e6, the ReLUs die and it plateaus at ~26, finite throughout (checked by running it plainly). Training is broken but nothing is non-finite, so nanguard must say nothing and not change the output.
import torch
from torch import nn

torch.manual_seed(5)
torch.set_num_threads(1)

enc = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
                    nn.Conv2d(32, 32, 3, stride=2, padding=1), nn.ReLU())
dec = nn.Sequential(nn.ConvTranspose2d(32, 32, 4, stride=2, padding=1), nn.ReLU(),
                    nn.ConvTranspose2d(32, 16, 4, stride=2, padding=1), nn.ReLU(), nn.Conv2d(16, 1, 3, padding=1))
model = nn.Sequential(enc, dec)
imgs = torch.rand(256, 1, 16, 16)
opt = torch.optim.Adam(model.parameters(), lr=1.0)
for step in range(200):
    xb = imgs[(step * 32) % 256:(step * 32) % 256 + 32]
    opt.zero_grad()
    loss = ((model(xb) - xb) ** 2).mean()
    loss.backward()
    opt.step()
    if step % 10 == 0:
        print(f"step {step} loss {loss.item():.4g}")
