"""Time a training step of a small MLP with and without layerscope.capture.

Run: OMP_NUM_THREADS=1 python tests/capture/capture_cost.py

Rounds interleave the variants; each prints the median over rounds of the mean step time.
Every capture is cleared between rounds, so kept memory does not grow across them.
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

import layerscope

STEPS = 50
ROUNDS = 11


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
    )


def _steps(model: nn.Module, optimizer: torch.optim.Optimizer, cap, x, y) -> float:
    start = time.perf_counter()
    for _ in range(STEPS):
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if cap is not None:
            cap.step()
    return (time.perf_counter() - start) / STEPS


def main() -> None:
    x, y = torch.randn(128, 64), torch.randint(0, 10, (128,))
    variants = {
        "unwatched": None,
        "capture(): whole activations and grads, every step": {},
        "capture(stash_value=std over the batch)": {"stash_value": lambda t: t.std(dim=0)},
        "capture(reduction='mean')": {"reduction": "mean"},
        "capture(every=10)": {"every": 10},
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    setups = {}
    for name, options in variants.items():
        model = _model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        cap = None if options is None else layerscope.capture(model, **options)
        setups[name] = (model, optimizer, cap)
        _steps(model, optimizer, cap, x, y)  # warm up
    for _ in range(ROUNDS):
        for name, (model, optimizer, cap) in setups.items():
            if cap is not None:
                cap.clear()
            times[name].append(_steps(model, optimizer, cap, x, y))
    base = statistics.median(times["unwatched"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:55s} {median * 1e3:7.3f} ms/step  {median / base:5.2f}x")
    for _, _, cap in setups.values():
        if cap is not None:
            cap.close()


if __name__ == "__main__":
    main()
