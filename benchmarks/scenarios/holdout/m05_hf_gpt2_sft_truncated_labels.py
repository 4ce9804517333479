# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.nll_loss_forward.default", "module": ""}
# about: held out (round 4, modern stack): written by someone who had not read the code. Supervised fine-tuning of a tiny Hugging Face GPT2LMHeadModel built from GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100) (no pretrained weights, no tokenizer) on synthetic prompt/response pairs, loss on the response tokens only (prompt labels = -100), right truncation to 32 tokens, and group-by-length batching (sorted by length, batches of 4, batches shuffled). A few prompts are pasted documents longer than 32 tokens: truncation cuts their whole response away, so their labels are all -100, and length bucketing puts four of them in one batch (batch 23). Inside GPT2LMHeadModel.forward, the built-in ForCausalLMLoss calls cross_entropy(reduction="mean") with zero non-ignored tokens, and aten.nll_loss_forward.default returns 0/0 = NaN (step 23 forward; the op runs in the root model's forward, so module ""). Its backward gives all-zero gradients, so the weights stay finite and only the loss is NaN; the user sees "avg loss nan" for steps 21-30, then finite values again. The benign -inf entries of the SDPA causal/padding mask come before it every step and must not be reported.
import random
import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

transformers.logging.set_verbosity_error()
torch.manual_seed(0)
torch.set_num_threads(1)
random.seed(0)

VOCAB, PAD, SEP, EOS = 100, 0, 1, 2
MAX_LEN = 32


def make_example(rng):
    """prompt tokens, SEP, response tokens (response = prompt digits reversed), EOS"""
    n = rng.randint(3, 10)
    if rng.random() < 0.03:          # a few users paste a whole document as the prompt
        n = rng.randint(40, 60)
    prompt = [rng.randint(3, VOCAB - 1) for _ in range(n)]
    response = list(reversed(prompt[:6]))
    return prompt + [SEP], response + [EOS]


def encode(prompt, response):
    ids = (prompt + response)[:MAX_LEN]                       # right truncation
    labels = ([-100] * len(prompt) + response)[:MAX_LEN]      # loss on the response only
    return ids, labels


def collate(batch):
    width = max(len(i) for i, _ in batch)
    ids = torch.full((len(batch), width), PAD)
    labels = torch.full((len(batch), width), -100)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for r, (i, l) in enumerate(batch):
        ids[r, :len(i)] = torch.tensor(i)
        labels[r, :len(l)] = torch.tensor(l)
        mask[r, :len(i)] = 1
    return ids, mask, labels


rng = random.Random(0)
data = [encode(*make_example(rng)) for _ in range(400)]
# group_by_length: sort by length and cut into batches of 4, then shuffle the batches (less padding)
order = sorted(range(len(data)), key=lambda k: len(data[k][0]))
batches = [order[i:i + 4] for i in range(0, len(order), 4)]
rng.shuffle(batches)

config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=64,
                    bos_token_id=EOS, eos_token_id=EOS, pad_token_id=PAD)
model = GPT2LMHeadModel(config)
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
sched = transformers.get_linear_schedule_with_warmup(opt, num_warmup_steps=10, num_training_steps=len(batches))

running = 0.0
for step, b in enumerate(batches[:60]):
    ids, mask, labels = collate([data[k] for k in b])
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad()
    running += out.loss.item()
    if step % 10 == 9:
        print(f"step {step + 1:3d} avg loss {running / 10:.4f}")
        running = 0.0
