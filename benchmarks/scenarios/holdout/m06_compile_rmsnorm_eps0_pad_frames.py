# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.rsqrt.default", "module": ["in_norm", "_orig_mod.in_norm"]}
# about: held out (round 4, modern stack): written by someone who had not read the code. A keyword-spotting 1-D conv net on synthetic log-mel clips, wrapped as cmodel = torch.compile(model, backend="aot_eager") and trained with AdamW through the compiled module. Its first layer is a hand-written RMSNorm over the 20 mel bins with eps=0.0 ("log-mels are ~2, eps is not needed"): x * rsqrt(mean(x^2) + eps) * weight. About 0.2% of clips were cut short by a VAD and zero-padded to 40 frames; the first batch holding one (step 4) has all-zero frames, so mean(x^2) = 0 and aten.rsqrt.default returns inf (then 0 * inf = NaN in the following mul) in the forward of the compiled module, inside the RMSNorm. Module: in_norm as the original model names it, or _orig_mod.in_norm as the compiled wrapper OptimizedModule names it (both accepted). Loss prints 1.79 at step 0 and NaN from step 4 on (printed from step 5).
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
torch.set_num_threads(1)

N_MELS, T_MAX, N_WORDS = 20, 40, 6


def make_clips(n, g):
    """synthetic log-mel 'keyword' clips: a word-specific spectral pattern + noise, variable length"""
    words = torch.randint(0, N_WORDS, (n,), generator=g)
    protos = torch.randn(N_WORDS, N_MELS, 1, generator=torch.Generator().manual_seed(123))
    t = torch.linspace(0, 3.14, T_MAX)
    clips = protos[words] * torch.sin(t * (1 + words[:, None, None] % 3)) + 0.5 * torch.randn(n, N_MELS, T_MAX, generator=g) + 2.0
    lengths = torch.full((n,), T_MAX)
    short = torch.rand(n, generator=g) < 0.002         # a few clips were cut short by the VAD
    lengths[short] = torch.randint(20, T_MAX, (int(short.sum()),), generator=g)
    for i in torch.nonzero(short).flatten().tolist():
        clips[i, :, lengths[i]:] = 0.0                  # zero padding up to T_MAX
    return clips, lengths, words


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=0.0):                   # features are log-mels ~2, eps "not needed"
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):                               # x: (B, T, C)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class KeywordSpotter(nn.Module):
    def __init__(self):
        super().__init__()
        self.in_norm = RMSNorm(N_MELS)
        self.conv1 = nn.Conv1d(N_MELS, 48, 5, padding=2)
        self.conv2 = nn.Conv1d(48, 48, 5, padding=2, groups=4)
        self.head = nn.Linear(48, N_WORDS)

    def forward(self, mels, lengths):
        x = self.in_norm(mels.transpose(1, 2)).transpose(1, 2)
        x = F.silu(self.conv1(x))
        x = F.silu(self.conv2(x)) + x
        valid = (torch.arange(x.shape[-1])[None, :] < lengths[:, None]).float()
        pooled = (x * valid[:, None, :]).sum(-1) / valid.sum(-1, keepdim=True)
        return self.head(pooled)


g = torch.Generator().manual_seed(0)
clips, lengths, words = make_clips(4000, g)
model = KeywordSpotter()
cmodel = torch.compile(model, backend="aot_eager")
opt = torch.optim.AdamW(cmodel.parameters(), lr=2e-3)

for step in range(40):
    sl = slice(step * 32, step * 32 + 32)
    logits = cmodel(clips[sl], lengths[sl])
    loss = F.cross_entropy(logits, words[sl])
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 5 == 0:
        print(f"step {step:3d} loss {loss.item():.4f}")
print("final loss", loss.item())
