"""PCA frames: each value's samples on the first two principal axes of the last value."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from layerscope.tensors._frames import (
    TensorFrames,
    Titles,
    new_axes,
    padded_range,
    tensor_of,
    to_float64,
)
from layerscope.tensors._records import Record

if TYPE_CHECKING:
    from matplotlib.artist import Artist

# torch.pca_lowrank is exact when its rank q is min(samples, features); up to this many it is
# cheap, past it a randomised rank-PCA_RANK fit with PCA_ITERATIONS power iterations.
PCA_EXACT = 64
PCA_RANK = 12
PCA_ITERATIONS = 4


@dataclass(frozen=True, slots=True)
class Projection:
    """A fit PCA: the mean it centres on and its top two components.

    Attributes:
        mean: (features,) the fit samples' mean.
        components: (features, 2), orthonormal columns, each with its largest loading
            positive.
        explained: (2,) each component's share of the fit samples' variance.
    """

    mean: np.ndarray
    components: np.ndarray
    explained: np.ndarray

    def project(self, samples: np.ndarray) -> np.ndarray:
        """(samples, features) to (samples, 2)."""
        projected: np.ndarray = (samples - self.mean) @ self.components
        return projected


def pca_samples(tensor: Tensor, max_points: int) -> tuple[np.ndarray, int]:
    """``tensor`` as (samples, features) float64 (see ``PCA``); how many samples were left out.

    At most ``max_points`` samples, evenly spaced; those holding a NaN or Inf are left out.
    """
    dims = tensor.dim()
    if dims <= 1:
        matrix = tensor.reshape(1, -1)
    elif dims == 2:
        matrix = tensor
    elif dims == 3:  # (batch, seq, hidden): every position a sample
        matrix = tensor.reshape(-1, tensor.shape[-1])
    else:  # (N, C, H, W, ...): channels averaged over the spatial dimensions
        matrix = tensor.to(torch.float64).mean(dim=tuple(range(2, dims)))
    count = matrix.shape[0]
    if count > max_points:
        rows = np.round(np.linspace(0, count - 1, max_points)).astype(np.int64)
        matrix = matrix[torch.from_numpy(rows).to(matrix.device)]
    samples = to_float64(matrix)
    finite = np.isfinite(samples).all(axis=1)
    return samples[finite], int((~finite).sum())


def fit_pca(samples: np.ndarray) -> Projection:
    """The top two principal components of (samples, features), by ``torch.pca_lowrank``.

    Raises:
        ValueError: fewer than 2 samples or 2 features.
    """
    count, features = samples.shape
    if count < 2 or features < 2:
        raise ValueError(
            f"value: PCA needs at least 2 samples with finite values and 2 features, as "
            f"(samples, features); got {count} x {features}"
        )
    rank = min(count, features)
    # pca_lowrank draws random numbers: seeded, and the caller's random state left alone.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        _, singular, basis = torch.pca_lowrank(
            torch.from_numpy(samples),
            q=rank if rank <= PCA_EXACT else PCA_RANK,
            center=True,
            niter=PCA_ITERATIONS,
        )
    components = basis[:, :2].numpy().copy()
    largest = np.abs(components).argmax(axis=0)
    signs = np.sign(components[largest, [0, 1]])
    components *= np.where(signs == 0, 1.0, signs)
    mean = samples.mean(axis=0)
    total = float(((samples - mean) ** 2).sum())
    explained = singular[:2].numpy() ** 2 / total if total > 0 else np.zeros(2)
    return Projection(mean=mean, components=components, explained=explained)


def pca_frames(
    values: list[Tensor | Record],
    size: tuple[float, float] | None,
    dpi: float | None,
    *,
    max_points: int,
) -> TensorFrames:
    """Scatters of ``values`` on one projection, fit on the last of them; fixed limits."""
    tensors = [tensor_of(value) for value in values]
    fit_samples, _ = pca_samples(tensors[-1], max_points)
    projection = fit_pca(fit_samples)
    features = fit_samples.shape[1]
    points, left_out = [], []
    for index, tensor in enumerate(tensors):
        samples, dropped = pca_samples(tensor, max_points)
        if samples.shape[1] != features:
            raise ValueError(
                f"value: frame {index} has {samples.shape[1]} features and the last frame, "
                f"which the PCA is fit on, {features}; one projection needs one feature count"
            )
        points.append(projection.project(samples))
        left_out.append(dropped)
    every = np.concatenate(points)
    lows = every.min(axis=0) if every.size else np.zeros(2)
    highs = every.max(axis=0) if every.size else np.zeros(2)

    fig, ax = new_axes(size, dpi)
    scatter = ax.scatter(points[0][:, 0], points[0][:, 1], s=9, color="C0", linewidths=0)
    ax.set_xlim(*padded_range(float(lows[0]), float(highs[0])))
    ax.set_ylim(*padded_range(float(lows[1]), float(highs[1])))
    last = values[-1]
    fit = f" at step {last.step}" if isinstance(last, Record) and len(values) > 1 else ""
    ax.set_xlabel(f"PC1 ({projection.explained[0]:.0%} of variance{fit})")
    ax.set_ylabel(f"PC2 ({projection.explained[1]:.0%})")
    titles = Titles(fig, ax, values, tensors)

    def draw(index: int) -> None:
        scatter.set_offsets(points[index])
        dropped = left_out[index]
        note = f"{dropped} samples with NaN/Inf left out" if dropped else ""
        titles.show(index, f"{len(points[index])} samples", note)

    moving: list[Artist] = [scatter, titles.caption]
    return TensorFrames(figure=fig, moving=moving, draw=draw, count=len(values))
