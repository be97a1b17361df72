"""The demo's two trainings: a small CNN on scikit-learn's digits, broken, then fixed.

The broken run has no normalisation and a learning rate ten times too high: within a few
dozen steps its ReLUs stop firing for every input, the dead-unit story of fastai's course.
The fixed run normalises each convolution's output (BatchNorm) and steps at 0.05: its units
stay alive and it learns. Both are seeded: the same numbers every time on a machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

import layerscope
from layerscope._imports import require

EPOCHS = 5
BATCH = 32
TRAIN = 1500  # of the 1,797 digits; the rest is the test set
EVERY = 5  # record every 5th step: the alerts see the units die as it happens


@dataclass(frozen=True)
class Recipe:
    """How one of the demo's runs trains."""

    name: str
    normalise: bool
    learning_rate: float
    story: str


BROKEN = Recipe("broken", False, 0.5, "no normalisation, learning rate 0.5")
FIXED = Recipe("fixed", True, 0.05, "BatchNorm after each convolution, learning rate 0.05")


@dataclass(frozen=True)
class Result:
    """A finished demo run: where it is, its test accuracy and its training time."""

    recipe: Recipe
    path: Path
    accuracy: float
    seconds: float


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    """The 1,797 8x8 digits scaled to [0, 1], as (N, 1, 8, 8) images, and their labels."""
    datasets = require("sklearn.datasets", "demo")
    bunch = datasets.load_digits()
    images = torch.tensor(bunch.images, dtype=torch.float32)[:, None] / 16.0
    return images, torch.tensor(bunch.target)


def cnn(normalise: bool) -> nn.Sequential:
    """Conv 16, ReLU, Conv 32 (stride 2), ReLU, Linear 10; BatchNorm after each Conv if asked."""
    layers: list[nn.Module] = [nn.Conv2d(1, 16, 3, padding=1)]
    layers += [nn.BatchNorm2d(16)] if normalise else []
    layers += [nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1)]
    layers += [nn.BatchNorm2d(32)] if normalise else []
    layers += [nn.ReLU(), nn.Flatten(), nn.Linear(32 * 4 * 4, 10)]
    return nn.Sequential(*layers)


def train(recipe: Recipe, path: Path, progress: Callable[[str], None]) -> Result:
    """Train one recipe, watched into ``path``; its test accuracy.

    On one thread: training at a learning rate this high is chaotic, and the order in which
    parallel sums add up would change the run's story with the machine's number of cores.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(recipe, path, progress)
    finally:
        torch.set_num_threads(threads)


def _train(recipe: Recipe, path: Path, progress: Callable[[str], None]) -> Result:
    images, labels = digits()
    torch.manual_seed(0)
    model = cnn(recipe.normalise)
    optimizer = torch.optim.SGD(model.parameters(), lr=recipe.learning_rate, momentum=0.9)
    order = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    with layerscope.watch(model, optimizer=optimizer, run=path, every=EVERY) as scope:
        for epoch in range(EPOCHS):
            for batch in torch.split(torch.randperm(TRAIN, generator=order), BATCH):
                loss = nn.functional.cross_entropy(model(images[batch]), labels[batch])
                torch.autograd.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
                scope.step(loss=loss)
            progress(f"  {recipe.name}: epoch {epoch + 1}/{EPOCHS}, loss {loss.item():.3f}")
    model.eval()
    with torch.no_grad():
        predicted = model(images[TRAIN:]).argmax(dim=1)
    accuracy = float((predicted == labels[TRAIN:]).float().mean())
    return Result(recipe, path, accuracy, time.perf_counter() - start)
