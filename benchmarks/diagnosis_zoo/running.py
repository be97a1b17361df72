"""A case trained while watched as the README recommends, and what the rules said."""

from __future__ import annotations

from dataclasses import dataclass

import torch

import layerscope
from diagnosis_zoo.case import Case
from diagnosis_zoo.scoring import Said

# The schedules each case is watched under: the default (every step of the first 10, then
# one in 100), and one step in 10.
SCHEDULES: dict[str, int | None] = {"default": None, "every=10": 10}
SEED = 0


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one watched training left: its alerts by step, and the steps it recorded."""

    said: tuple[Said, ...]
    recorded: tuple[int, ...]
    losses: tuple[float, ...]


def train(case: Case, buggy: bool, every: int | None) -> Outcome:
    """Train ``case`` (or its twin) from a fixed seed, watched with ``optimizer=`` in memory."""
    torch.manual_seed(SEED)
    loop = case.build(buggy)
    losses = []
    with layerscope.watch(
        loop.model, optimizer=loop.optimizer, run=None, every=every, attention=case.attention
    ) as scope:
        for step in range(case.steps):
            loss = loop(step)
            scope.step(loss=loss)
            losses.append(float(loss.detach()))
    alerts = scope.frame("alerts")
    said = [
        Said(int(a.step), str(a.rule), str(a.module), str(a.severity)) for a in alerts.itertuples()
    ]
    said.sort(key=lambda alert: alert.step)  # stable: a step's alerts keep the rules' order
    recorded = tuple(sorted({int(step) for step in scope.frame()["step"]}))
    return Outcome(tuple(said), recorded, tuple(losses))
