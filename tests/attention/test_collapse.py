"""attention_collapse end to end: a head made to collapse mid-run is named by the run's alerts;
the same training left alone raises none."""

import torch
import torch.nn.functional as F
from torch import nn

import layerscope

HEADS, DIM, LENGTH, BATCH, VOCAB = 4, 32, 32, 4, 64
WIDTH = DIM // HEADS
STEPS, PLANTED_AT = 12, 6
LAYER, HEAD = 1, 2  # the head made to collapse


class SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.proj = nn.Linear(DIM, DIM)

    def forward(self, x):
        b, length, _ = x.shape
        q, k, v = self.qkv(x).view(b, length, 3, HEADS, WIDTH).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (b, heads, length, width)
        return self.proj(out.transpose(1, 2).reshape(x.shape))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = nn.LayerNorm(DIM)
        self.attn = SelfAttention()
        self.norm2 = nn.LayerNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.position = nn.Parameter(0.02 * torch.randn(LENGTH, DIM))
        self.blocks = nn.ModuleList([Block(), Block()])
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens) + self.position
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def _sharpen(attention: SelfAttention, factor: float) -> None:
    """Scale one head's query and key projections: its logits grow by ``factor ** 2``."""
    rows = torch.arange(HEAD * WIDTH, (HEAD + 1) * WIDTH)
    with torch.no_grad():
        for part in (rows, rows + DIM):  # the head's rows of q, then of k
            attention.qkv.weight[part] *= factor
            attention.qkv.bias[part] *= factor


def _train(planted: bool):
    torch.manual_seed(0)
    model = GPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    with layerscope.watch(model, optimizer, every=1, attention=True) as scope:
        for step in range(STEPS):
            if planted and step == PLANTED_AT:
                _sharpen(model.blocks[LAYER].attn, 30.0)
            tokens = torch.randint(0, VOCAB, (BATCH, LENGTH + 1), generator=generator)
            logits = model(tokens[:, :-1])
            F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)).backward()
            optimizer.step()
            optimizer.zero_grad()
    return scope


def test_a_collapsed_head_is_named_and_no_other():
    scope = _train(planted=True)
    attention = scope.frame("attention")
    module = f"blocks.{LAYER}.attn"
    planted = (attention.module == module) & (attention["head"] == HEAD)
    # The planted change did what it should: that head near one-hot from the step it was made,
    # every other head still spread over most of its keys.
    after = attention[planted & (attention.step >= PLANTED_AT)]
    assert len(after) == STEPS - PLANTED_AT
    assert (after.entropy_frac < 0.05).all()
    assert (attention[~planted].entropy_frac > 0.5).all()
    alerts = scope.frame("alerts")
    collapse = alerts[alerts.rule == "attention_collapse"]
    assert len(collapse) >= 1
    assert set(collapse.module) == {module}
    assert set(collapse.tensor) == {f"head {HEAD}"}
    assert (collapse.step >= PLANTED_AT).all()
    assert (collapse.kind == "attention").all()


def test_the_same_training_left_alone_raises_no_collapse():
    scope = _train(planted=False)
    attention = scope.frame("attention")
    assert len(attention) == STEPS * 2 * HEADS  # it was watched as closely
    alerts = scope.frame("alerts")
    assert (alerts.rule != "attention_collapse").all()
