# expect: {"cause": "learning-rate-too-high", "phase": "backward", "op": "aten.native_layer_norm_backward.default", "module": "encoder.layers.0.norm2"}
# about: held out (lr round): char-level LM with nn.TransformerEncoder (causal -inf mask) trained by SGD momentum 0.9 at lr=10 instead of a sane 0.1 (100x), the loss stays finite but the LayerNorm backward of layer 0 turns NaN at step 6.
"""Char-level language model (nn.TransformerEncoder, causal mask) on a generated nursery-rhyme corpus."""
import os
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"

# hyper-parameters
D_MODEL = 64
N_HEAD = 4
N_LAYERS = 2
CONTEXT = 32
BATCH = 16
STEPS = 150
LEARNING_RATE = 0.1 if FIXED else 10.0
MOMENTUM = 0.9


def make_corpus(n_lines=400, seed=0):
    rng = random.Random(seed)
    subjects = ["the cat", "a dog", "my hen", "the old cow", "a small mouse", "the fox"]
    verbs = ["sat on", "ran to", "jumped over", "looked at", "slept by"]
    objects = ["the mat", "a log", "the barn", "the moon", "a red box", "the well"]
    lines = [f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}." for _ in range(n_lines)]
    return "\n".join(lines)


class CharLM(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.tok = nn.Embedding(vocab, D_MODEL)
        self.pos = nn.Parameter(torch.zeros(1, CONTEXT, D_MODEL))
        layer = nn.TransformerEncoderLayer(D_MODEL, N_HEAD, dim_feedforward=4 * D_MODEL,
                                           dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, N_LAYERS, enable_nested_tensor=False)
        self.ln_f = nn.LayerNorm(D_MODEL)
        self.lm_head = nn.Linear(D_MODEL, vocab)
        mask = nn.Transformer.generate_square_subsequent_mask(CONTEXT)
        self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        h = self.tok(idx) + self.pos[:, :t]
        h = self.encoder(h, mask=self.causal_mask[:t, :t])
        return self.lm_head(self.ln_f(h))


def get_batch(data):
    ix = torch.randint(0, len(data) - CONTEXT - 1, (BATCH,))
    x = torch.stack([data[i:i + CONTEXT] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + CONTEXT] for i in ix])
    return x, y


def main():
    torch.manual_seed(0)
    text = make_corpus()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    model = CharLM(len(chars))
    opt = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)
    for step in range(STEPS):
        x, y = get_batch(data)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 15 == 0:
            print(f"step {step} loss {loss.item():.4f}")
    model.eval()
    with torch.no_grad():
        losses = []
        for _ in range(8):
            x, y = get_batch(data)
            logits = model(x)
            losses.append(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item())
    print(f"final loss {sum(losses) / len(losses)}")


if __name__ == "__main__":
    main()
