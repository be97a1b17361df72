"""Small real runs for the figure tests: recorded once per module, read by every test."""

from __future__ import annotations

import warnings
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.axes import Axes
from matplotlib.lines import Line2D
from torch import nn

import layerscope

matplotlib.use("Agg")

LAYERS = ["0", "1", "2"]  # Linear, ReLU, Linear: model order


def record(
    path: Path,
    steps: int,
    *,
    update: bool = True,
    nan_at: int | None = None,
    histogram: object = "log2",
) -> Path:
    """Train a tiny model for ``steps`` steps, every step recorded, into ``path``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    kinds = ("activation", "grad", "weight", "weight_grad") + (("update",) if update else ())
    with (
        warnings.catch_warnings(),
        layerscope.watch(
            model, run=path, every=1, optimizer=optimizer, kinds=kinds, histogram=histogram
        ) as scope,
    ):
        warnings.simplefilter("ignore")  # the non-finite alert warns; here it is wanted
        for step in range(steps):
            inputs = torch.randn(6, 4)
            if step == nan_at:
                inputs[0, 0] = float("nan")
            loss = model(inputs).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step(loss=loss, lr=0.1 * (step + 1))
    return path


@pytest.fixture(scope="session")
def run(tmp_path_factory: pytest.TempPathFactory) -> layerscope.Run:
    return layerscope.load(record(tmp_path_factory.mktemp("plots") / "run", 5))


@pytest.fixture(scope="session")
def nan_run(tmp_path_factory: pytest.TempPathFactory) -> layerscope.Run:
    return layerscope.load(record(tmp_path_factory.mktemp("plots") / "nan", 4, nan_at=2))


@pytest.fixture(scope="session")
def single_step_run(tmp_path_factory: pytest.TempPathFactory) -> layerscope.Run:
    return layerscope.load(record(tmp_path_factory.mktemp("plots") / "one", 1))


@pytest.fixture(scope="session")
def plain_run(tmp_path_factory: pytest.TempPathFactory) -> layerscope.Run:
    return layerscope.load(record(tmp_path_factory.mktemp("plots") / "plain", 2, update=False))


# The Linear layers' outputs spread past +-1: the open slots below LO and from HI on hold counts.
LINEAR = ("linear", -1.0, 1.0, 8)


@pytest.fixture(scope="session")
def linear_run(tmp_path_factory: pytest.TempPathFactory) -> layerscope.Run:
    return layerscope.load(record(tmp_path_factory.mktemp("plots") / "linear", 4, histogram=LINEAR))


def reference(
    run: layerscope.Run, kind: str, tensor: str, stat: str
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """module -> (steps, float64 values) from the whole stats table, independently of plots."""
    stats = run.stats
    rows = stats[
        (stats["kind"] == kind)
        & (stats["tensor"] == tensor)
        & (stats["phase"] == "train")
        & (stats["call"] == 0)
        & ~stats["sentinel"].fillna(False).astype(bool)
    ].sort_values("step")
    return {
        module: (
            group["step"].to_numpy(dtype=np.int64),
            pd.to_numeric(group[stat]).to_numpy(dtype=np.float64),
        )
        for module, group in rows.groupby("module")
    }


def widened_histograms(
    run: layerscope.Run, module: str, kind: str = "activation", tensor: str = "out"
) -> tuple[np.ndarray, np.ndarray]:
    """(steps, (slots, steps) counts) of one layer, from run.stats' widened histograms."""
    stats = run.stats
    rows = stats[
        (stats["module"] == module)
        & (stats["kind"] == kind)
        & (stats["tensor"] == tensor)
        & ~stats["sentinel"].fillna(False).astype(bool)
    ].sort_values("step")
    counts = np.stack([np.asarray(hist, dtype=np.float64) for hist in rows["hist"]], axis=1)
    return rows["step"].to_numpy(), counts


def layer_lines(axes: Axes) -> list[Line2D]:
    """The lines labelled by a module name (not the band or reference lines)."""
    return [line for line in axes.lines if not line.get_label().startswith("_")]


def assert_lines_match(
    axes: Axes, expected: dict[str, tuple[np.ndarray, np.ndarray]], layers: list[str]
) -> None:
    lines = layer_lines(axes)
    assert [line.get_label() for line in lines] == layers
    for line, name in zip(lines, layers, strict=True):
        steps, values = expected[name]
        np.testing.assert_array_equal(line.get_xdata(), steps)
        np.testing.assert_allclose(line.get_ydata(), values, rtol=1e-12, equal_nan=True)
