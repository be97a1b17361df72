"""The demo's two trainings: a small CNN on scikit-learn's digits, broken, then fixed.

The broken run normalises nothing, neither its pixels (0 to 16) nor its layers, and steps at
0.5, ten times too high: by its step 5 every ReLU unit has stopped firing for every input,
the dead-unit story of fastai's course. The fixed run scales the pixels to [0, 1],
normalises each convolution's output (BatchNorm) and steps at 0.05: its units stay alive and
it learns.

The broken run's story holds on any CPU. A run at this learning rate is chaotic, so one whose
units died slowly would die at other steps, or other units, wherever the kernels round
differently. Here they die at once and wholly: from then on their outputs and every gradient
before them are exact zeros, which no rounding changes. The seed is one where that happens;
tests/cli/test_cli_demo.py checks the story under perturbations much larger than rounding.
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
SEED = 6  # both runs'; the broken one's ReLUs all die by its 5th step (see above)
PIXELS = 16.0  # the digits' pixels are 0 to 16


@dataclass(frozen=True)
class Recipe:
    """How one of the demo's runs trains."""

    name: str
    normalise: bool  # the pixels scaled to [0, 1] and BatchNorm after each convolution
    learning_rate: float
    story: str


BROKEN = Recipe("broken", False, 0.5, "raw pixels 0 to 16, no BatchNorm, learning rate 0.5")
FIXED = Recipe(
    "fixed",
    True,
    0.05,
    "pixels scaled to [0, 1], BatchNorm after each convolution, learning rate 0.05",
)


@dataclass(frozen=True)
class Result:
    """A finished demo run: where it is, its test accuracy and its training time."""

    recipe: Recipe
    path: Path
    accuracy: float
    seconds: float


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    """The 1,797 8x8 digits as (N, 1, 8, 8) images of pixels 0 to 16, and their labels."""
    datasets = require("sklearn.datasets", "demo")
    bunch = datasets.load_digits()
    return torch.tensor(bunch.images, dtype=torch.float32)[:, None], torch.tensor(bunch.target)


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

    On one thread: the story does not need it, but the digits printed are then the same on a
    machine whatever its number of cores.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(recipe, path, progress)
    finally:
        torch.set_num_threads(threads)


def _train(recipe: Recipe, path: Path, progress: Callable[[str], None]) -> Result:
    images, labels = digits()
    if recipe.normalise:
        images = images / PIXELS
    torch.manual_seed(SEED)
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
