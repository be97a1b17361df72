"""Train a small GPT on scikit-learn's digits, collapse one head midway, and draw its heads.

Run: python examples/attention.py [OUT]   (needs: pip install 'layerscope[demo,plot]')

Each digit is a sequence of 64 pixels (16 grey levels, 17 tokens); the GPT (4 layers of 4
heads, causal attention by ``F.scaled_dot_product_attention``) learns to predict the next
pixel. At step 50 the queries of head 1 of ``blocks.2.attn`` are multiplied by 100: its
attention logits grow 100 times, and it puts nearly all its weight on one key, the entropy
collapse that comes before loss spikes in unstable training. ``watch(attention=True)``
records every head's entropy on each step; the figure goes to OUT/attention.png (default:
docs/images), the run to runs/attention.
"""

import shutil
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

import layerscope

STEPS, COLLAPSE_AT = 100, 50
TOKENS, CONTEXT, WIDTH, HEADS, LAYERS = 17, 32, 64, 4, 4


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # (3, batch, heads, tokens, width per head)
        q, k, v = self.qkv(x).view(b, t, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(b, t, WIDTH))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attn = Attention()
        self.mlp = nn.Sequential(
            nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(TOKENS, WIDTH)
        self.position = nn.Parameter(torch.zeros(CONTEXT, WIDTH))
        self.blocks = nn.ModuleList([Block() for _ in range(LAYERS)])
        self.ln = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, TOKENS)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def train(path: Path) -> layerscope.Run:
    torch.manual_seed(0)
    pixels = torch.tensor(load_digits().data, dtype=torch.long)  # (1797, 64), 0 to 16
    model = GPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    shutil.rmtree(path, ignore_errors=True)  # a run from an earlier call
    with layerscope.watch(model, optimizer, run=path, every=1, attention=True) as scope:
        for step in range(STEPS):
            if step == COLLAPSE_AT:
                with torch.no_grad():  # rows 16 to 31 of qkv make head 1's queries
                    model.blocks[2].attn.qkv.weight[16:32].mul_(100.0)
            tokens = pixels[torch.randint(0, len(pixels), (32,)), : CONTEXT + 1]
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, TOKENS), tokens[:, 1:].reshape(-1))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step(loss=loss)
    return layerscope.load(path)


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/images")
    out.mkdir(parents=True, exist_ok=True)
    run = train(Path("runs/attention"))
    run.plot.attention().savefig(out / "attention.png", dpi=72)
    print(out / "attention.png")


if __name__ == "__main__":
    main()
