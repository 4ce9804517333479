# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.div.Tensor", "module": ""}
# about: held out: written after the suite by someone who had not read it. A tiny "HF-style" token-classification model: forward(input_ids=..., attention_mask=...,
# A tiny "HF-style" token-classification model: forward(input_ids=..., attention_mask=...,
# labels=...) returns an output object with .loss. The loss is the masked mean over real
# tokens: sum(loss * mask) / mask.sum(). A batch of empty examples (all padding) appears
# once the dataset is sorted by length ("bucketing" to save padding).
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
VOCAB, PAD, NLAB, T = 100, 0, 5, 16


@dataclass
class TokenClassifierOutput:
    loss: torch.Tensor
    logits: torch.Tensor


class TinyEncoder(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.embeddings = nn.Embedding(VOCAB, d, padding_idx=PAD)
        self.encoder = nn.GRU(d, d, batch_first=True)
        self.classifier = nn.Linear(d, NLAB)

    def forward(self, input_ids=None, attention_mask=None, labels=None):
        h, _ = self.encoder(self.embeddings(input_ids))
        logits = self.classifier(h)
        loss = None
        if labels is not None:
            tok_loss = F.cross_entropy(logits.reshape(-1, NLAB), labels.reshape(-1), reduction="none")
            m = attention_mask.reshape(-1).float()
            loss = (tok_loss * m).sum() / m.sum()
        return TokenClassifierOutput(loss=loss, logits=logits)


# synthetic corpus: lengths 0..15, label = token id mod 5; sorted by length (bucketing)
lengths = torch.randint(0, T, (320,))
lengths[:16] = 0                     # some empty lines in the corpus
lengths, _ = lengths.sort(descending=True)
ids = torch.randint(1, VOCAB, (320, T))
mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
ids = ids * mask
labels = ids % NLAB

model = TinyEncoder()
optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
for step, i in enumerate(range(0, 320, 16)):
    batch = {"input_ids": ids[i:i + 16], "attention_mask": mask[i:i + 16], "labels": labels[i:i + 16]}
    out = model(**batch)
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {out.loss.item():.4f}")
