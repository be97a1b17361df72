"""What the zoo trains on: scikit-learn's bundled digits, and a text of words made here.

Batches are chosen by step from a generator of their own, so a case and its healthy twin see
the same batches whatever else draws random numbers (dropout, initialisation).
"""

from __future__ import annotations

import random
from functools import cache

import torch
from torch import Tensor

BATCH = 32
PAD = 0  # the text's padding token: index 0 of its vocabulary
_WORDS = (
    "the", "a", "cat", "dog", "bird", "sat", "ran", "flew", "on", "under", "over", "mat", "log",
    "tree", "and", "then", "quickly", "slowly", "red", "blue", "small", "big", "saw", "heard",
    "found",
)  # fmt: skip


@cache
def digits() -> tuple[Tensor, Tensor]:
    """The 1,797 digits as images in [0, 1], (1797, 1, 8, 8), and their labels."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = torch.tensor(bunch.images, dtype=torch.float32)[:, None] / 16.0
    return images, torch.tensor(bunch.target)


def chosen(step: int, count: int, size: int = BATCH, seed: int = 0) -> Tensor:
    """The indices of step ``step``'s batch among ``count`` examples."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(0, count, (size,), generator=generator)


def digit_batch(step: int, flat: bool = False) -> tuple[Tensor, Tensor]:
    """Step ``step``'s batch of digits: images (32, 1, 8, 8), or (32, 64) if ``flat``."""
    images, labels = digits()
    at = chosen(step, len(labels))
    x = images[at]
    return (x.flatten(1) if flat else x), labels[at]


@cache
def text() -> tuple[Tensor, int]:
    """A text of random sentences over a small vocabulary, as token ids, and its vocabulary.

    Ids start at 1: 0 is the padding token.
    """
    words = random.Random(0)
    sentences = [
        " ".join(words.choice(_WORDS) for _ in range(words.randint(3, 8))) + "."
        for _ in range(3000)
    ]
    joined = " ".join(sentences)
    alphabet = sorted(set(joined))
    ids = {char: i + 1 for i, char in enumerate(alphabet)}
    return torch.tensor([ids[char] for char in joined]), len(alphabet) + 1


def text_batch(step: int, length: int = 32) -> tuple[Tensor, Tensor]:
    """Step ``step``'s windows of the text: tokens (32, length) and the next tokens."""
    tokens, _ = text()
    starts = chosen(step, len(tokens) - length - 1)
    windows = torch.stack([tokens[start : start + length + 1] for start in starts.tolist()])
    return windows[:, :-1], windows[:, 1:]
