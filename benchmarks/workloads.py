"""The models the overhead benchmark trains: a miniai-style CNN, a mini GPT, an MLP, and a
model of many small modules (``scale``), where the cost per hooked module dominates the step."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class Workload:
    name: str
    make_model: Callable[[], nn.Module]
    make_batch: Callable[[torch.Generator], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    # torch's threads for this workload, where not the benchmark's --threads.
    threads: int | None = None


def _cnn() -> nn.Module:
    def conv(c_in: int, c_out: int, act: bool = True) -> nn.Module:
        layer = nn.Conv2d(c_in, c_out, 3, stride=2, padding=1)
        return nn.Sequential(layer, nn.ReLU()) if act else layer

    # (256, 1, 28, 28) -> 14 -> 7 -> 4 -> 2 -> 1
    return nn.Sequential(
        conv(1, 8), conv(8, 16), conv(16, 32), conv(32, 64), conv(64, 10, act=False), nn.Flatten()
    )


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class MiniGPT(nn.Module):
    def __init__(
        self, vocab: int = 1024, dim: int = 256, heads: int = 4, layers: int = 4, context: int = 128
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Parameter(torch.zeros(context, dim))
        self.blocks = nn.ModuleList([Block(dim, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied
        mask = torch.triu(torch.full((context, context), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        x = self.embed(tokens) + self.position[:length]
        for block in self.blocks:
            x = block(x, self.mask[:length, :length])
        return self.head(self.norm(x))


def _mlp() -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(6):
        layers += [nn.Linear(1024, 1024), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class Residual(nn.Module):
    """``x + GELU(LayerNorm(Linear(x)))``: three watched leaves in a Sequential of its own."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(dim, dim), nn.LayerNorm(dim), nn.GELU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


SCALE_BLOCKS, SCALE_DIM, SCALE_BATCH = 250, 64, 4


def _scale() -> nn.Module:
    # 1,251 modules: the root, its 250 blocks, their 250 Sequentials and 750 leaves, of which
    # layerscope watches the 750 leaves (blocks and Sequentials own no parameters).
    return nn.Sequential(*(Residual(SCALE_DIM) for _ in range(SCALE_BLOCKS)))


def _images(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(256, 1, 28, 28, generator=generator), torch.randint(
        0, 10, (256,), generator=generator
    )


def _tokens(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, 1024, (8, 129), generator=generator)
    return tokens[:, :-1], tokens[:, 1:]


def _vectors(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(128, 1024, generator=generator), torch.randn(128, 1024, generator=generator)


def _small_vectors(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (SCALE_BATCH, SCALE_DIM)
    return torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)


def _token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


WORKLOADS = {
    "cnn": Workload("cnn", _cnn, _images, nn.functional.cross_entropy),
    "gpt": Workload("gpt", MiniGPT, _tokens, _token_loss),
    "mlp": Workload("mlp", _mlp, _vectors, nn.functional.mse_loss),
    # One thread: its ops are too small to split, but LayerNorm splits its 4 rows over two,
    # 500 parallel regions a step; with another process on a 2-core machine each waits for a
    # descheduled thread, and the step took 4x as long, 100x in single steps.
    "scale": Workload("scale", _scale, _small_vectors, nn.functional.mse_loss, threads=1),
}
