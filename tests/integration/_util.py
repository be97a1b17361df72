"""Shared checks for the integration tests: public API only (``scope.frame``)."""

from __future__ import annotations

import math

import torch
from torch import nn


def select(frame, **equal):
    """Rows of ``frame`` whose columns equal the given values."""
    mask = None
    for column, value in equal.items():
        match = frame[column] == value
        mask = match if mask is None else mask & match
    return frame if mask is None else frame[mask]


def assert_one_merged_row(frame, *, step, module, kind, phase, passes, tensor=None):
    """One row per tensor at call 0, holding ``passes`` calls' worth of elements.

    ``shape`` is the shape of one call, so a row that merged ``passes`` forward passes (micro
    batches, or evaluation batches) counts ``passes`` times its elements.
    """
    rows = select(frame, step=step, module=module, kind=kind, phase=phase)
    if tensor is not None:
        rows = select(rows, tensor=tensor)
    where = f"step {step}, {module!r}, {kind}, {phase}"
    assert len(rows), f"no rows at {where}"
    assert sorted(rows.call) == [0] * len(rows), f"calls at {where}: {sorted(rows.call)}"
    assert rows.tensor.is_unique, f"tensors at {where}: {list(rows.tensor)}"
    for _, row in rows.iterrows():
        one_call = math.prod(row["shape"])
        assert row["numel"] == passes * one_call, (
            f"{where}, {row['tensor']}: numel {row['numel']} is not {passes} x {one_call}"
        )


def calls_per_forward(model: nn.Module, run_forward) -> dict[str, int]:
    """How many times each module of ``model`` runs in one call of ``run_forward()``."""
    counts: dict[str, int] = {}
    handles = []
    for name, module in model.named_modules():

        def count(module, args, name=name):
            counts[name] = counts.get(name, 0) + 1

        handles.append(module.register_forward_pre_hook(count))
    try:
        with torch.no_grad():
            run_forward()
    finally:
        for handle in handles:
            handle.remove()
    return counts


def assert_same_parameters(a: nn.Module, b: nn.Module) -> None:
    pairs = list(zip(a.named_parameters(), b.named_parameters(), strict=True))
    assert pairs
    for (name, x), (_, y) in pairs:
        assert torch.equal(x, y), f"{name} differs from the unwatched run"


def has_no_hooks(model: nn.Module) -> bool:
    return not any(
        m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in model.modules()
    )
