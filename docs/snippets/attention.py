import torch
import torch.nn.functional as F
from torch import nn

import layerscope

VOCAB, DIM, HEADS = 64, 32, 4


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.out = nn.Linear(DIM, DIM)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, DIM))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attention()
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        x = x + self.attn(x)
        return x + self.mlp(x)


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        return self.head(self.blocks(self.embed(tokens)))


torch.manual_seed(0)
model = GPT().double()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
with layerscope.watch(model, optimizer=optimizer, every=5, attention=True) as scope:
    for step in range(30):
        if step == 15:  # plant a collapse: block 1's head 2 gets queries 300 times larger
            with torch.no_grad():
                model.blocks[1].attn.qkv.weight[2 * 8 : 3 * 8] *= 300
        tokens = torch.randint(0, VOCAB, (8, 33))
        logits = model(tokens[:, :-1])
        F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)).backward()
        optimizer.step()
        optimizer.zero_grad()

frame = scope.frame("attention")
print(frame.columns.tolist())
block = frame[frame.module == "blocks.1.attn"]
print(block.pivot(index="step", columns="head", values="entropy_frac").round(3).to_string())
alerts = scope.frame("alerts")
for alert in alerts[alerts.rule == "attention_collapse"].itertuples():
    print(f"step {alert.step}: {alert.module} {alert.tensor}: {alert.message}")
