# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten._softmax.default", "module": "blocks.0.attn"}
# about: held out: written after the suite by someone who had not read it. Char-level GPT (nanoGPT style). Batches are left-padded to the longest sequence;
# Char-level GPT (nanoGPT style). Batches are left-padded to the longest sequence;
# the key-padding mask is combined with the causal mask. Bug: with LEFT padding, the
# first query position of a padded sequence can only see padded keys -> whole row -inf.
import math
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
text = ("to be or not to be that is the question whether tis nobler in the mind to suffer "
        "the slings and arrows of outrageous fortune or to take arms against a sea of troubles ") * 4
chars = sorted(set(text))
PAD = 0
stoi = {c: i + 1 for i, c in enumerate(chars)}
vocab = len(chars) + 1
data = torch.tensor([stoi[c] for c in text])
block = 32


class CausalSelfAttention(nn.Module):
    def __init__(self, d, n_head):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.register_buffer("causal", torch.triu(torch.ones(block, block), diagonal=1).bool())

    def forward(self, x, pad_mask):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        att = att.masked_fill(self.causal[:T, :T], float("-inf"))
        att = att.masked_fill(pad_mask[:, None, None, :], float("-inf"))   # mask padded keys
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, d, n_head):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, n_head)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, pad_mask):
        x = x + self.attn(self.ln1(x), pad_mask)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, d=48, n_head=4, n_layer=2):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(block, d)
        self.blocks = nn.ModuleList([Block(d, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        B, T = idx.shape
        pad_mask = idx == PAD
        x = self.tok(idx) + self.pos(torch.arange(T))
        for blk in self.blocks:
            x = blk(x, pad_mask)
        return self.head(self.ln_f(x))


def get_batch(step):
    ix = torch.randint(len(data) - block - 1, (16,))
    x = torch.stack([data[i:i + block] for i in ix])
    y = torch.stack([data[i + 1:i + block + 1] for i in ix])
    if step >= 6:  # from here on the loader mixes in short lines, left-padded
        n = 5 + step % 10
        x[:4, :block - n] = PAD
        y[:4, :block - n] = -100   # no loss on padding
    return x, y


model = GPT()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
for step in range(20):
    x, y = get_batch(step)
    logits = model(x)
    loss = F.cross_entropy(logits.view(-1, vocab), y.view(-1), ignore_index=-100)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}")
