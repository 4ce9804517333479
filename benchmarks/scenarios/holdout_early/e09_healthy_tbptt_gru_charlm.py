# expect: {"healthy": true}
# about: held out (round early): A character-level GRUCell language model reads 32 parallel text streams with truncated backprop through time (hidden state detached every 40 characters, carried across chunks) and gradient clipping; all values stay finite and the loss drops steadily.
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
torch.set_num_threads(1)

# ---- synthetic corpus: sentences from a tiny grammar ----
subjects = ["the cat", "a dog", "my friend", "the old man", "our teacher", "a small bird"]
verbs = ["sees", "likes", "follows", "finds", "draws", "calls"]
objects = ["the ball", "a red car", "the garden", "a long river", "the moon", "his shadow"]
g = torch.Generator().manual_seed(3)
sentences = []
for _ in range(4000):
    s, v, o = (torch.randint(6, (3,), generator=g)).tolist()
    sentences.append(f"{subjects[s]} {verbs[v]} {objects[o]}. ")
text = "".join(sentences)
chars = sorted(set(text))
V = len(chars)
stoi = {c: i for i, c in enumerate(chars)}
data = torch.tensor([stoi[c] for c in text])

B, CHUNK = 32, 40
stream_len = len(data) // B
streams = data[:B * stream_len].view(B, stream_len)        # 32 contiguous streams


class CharGRU(nn.Module):
    def __init__(self, vocab, emb=24, hid=128):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.cell = nn.GRUCell(emb, hid)
        self.head = nn.Linear(hid, vocab)

    def forward(self, x, h):
        e = self.emb(x)
        logits = []
        for t in range(x.shape[1]):
            h = self.cell(e[:, t], h)
            logits.append(self.head(h))
        return torch.stack(logits, 1), h


model = CharGRU(V)
opt = torch.optim.Adam(model.parameters(), lr=3e-3)
h = torch.zeros(B, 128)

pos = 0
for step in range(100):
    if pos + CHUNK + 1 > stream_len:
        pos = 0
        h = torch.zeros(B, 128)
    x = streams[:, pos:pos + CHUNK]
    y = streams[:, pos + 1:pos + CHUNK + 1]
    pos += CHUNK
    h = h.detach()                                        # truncated BPTT: cut the graph at the chunk boundary
    logits, h = model(x, h)
    loss = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    opt.step()
    if step % 5 == 0 or step == 99:
        print(f"step {step:3d} loss {loss.item():.4f} bpc {loss.item() / 0.6931:.3f}")
