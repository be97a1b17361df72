"""Random flushes for the health rules: a small model's rows, several steps a flush.

Each flush holds recorded training steps (every kind, some modules called twice, some steps
evaluated too), the sentinel's rows of the steps between, and the scalars (a loss with
spikes, steps marked skipped). Values are drawn wide enough for every rule to fire and clear:
layers dying and reviving, gradients and outputs jumping by orders of magnitude, NaN and Inf,
weights left unchanged, updates missing or zero.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

import torch

from layerscope.model import CallEvent, Form, Identities, Identity, Kind, ModuleInfo, StatsRows

_TYPES = ("Linear", "ReLU", "Dropout", "LayerNorm", "GELU")
_PARAMETERS = {"Linear": ("weight", "bias"), "LayerNorm": ("weight", "bias")}
_COUNTS = ("numel", "nan_count", "inf_count")


def model(rng: random.Random) -> list[ModuleInfo]:
    """A model of a few modules, in ``named_modules()`` order."""
    infos = [ModuleInfo("", "Net", {}, 0, 0, (), True)]
    for index in range(rng.randint(3, 9)):
        infos.append(ModuleInfo(str(index), rng.choice(_TYPES), {}, 0, 0, (), True))
    return infos


def call_order(rng: random.Random, infos: list[ModuleInfo], step: int) -> list[CallEvent]:
    """A forward call order: the model's, or another, as a logged one may be."""
    names = [info.name for info in infos[1:]]
    if rng.random() < 0.5:
        rng.shuffle(names)
    events = [CallEvent(step, i, "exit", name, 0) for i, name in enumerate([*names, ""])]
    return events


class Flushes:
    """A run's flushes: each ``(chunks, scalars)``."""

    def __init__(self, seed: int, infos: list[ModuleInfo]) -> None:
        self.rng = random.Random(seed)
        self.infos = infos
        self.identities = Identities()
        self.step = 0
        self.weights: dict[str, dict[str, float]] = {}  # kept unchanged at times
        self.dead: set[str] = set()
        self.scale: dict[tuple[str, str], float] = {}

    def __iter__(self) -> Iterator[tuple[list[StatsRows], list[tuple[int, str, float]]]]:
        while True:
            yield self.flush()

    def flush(self) -> tuple[list[StatsRows], list[tuple[int, str, float]]]:
        rng = self.rng
        recorded: list[tuple[int, Identity, dict[str, float]]] = []
        sentinel: list[tuple[int, Identity, dict[str, float]]] = []
        scalars: list[tuple[int, str, float]] = []
        for _ in range(rng.randint(1, 4)):
            self.step += 1 if rng.random() < 0.7 else rng.randint(2, 5)
            recorded += self._step(self.step, "train")
            if rng.random() < 0.2:
                recorded += self._step(self.step, "eval")
            for step in range(self.step, self.step + (1 if rng.random() < 0.5 else 0) + 1):
                loss = 2.0 + rng.random() * 0.1 + (20.0 if rng.random() < 0.05 else 0.0)
                scalars.append((step, "loss", loss))
                if rng.random() < 0.1:
                    scalars.append((step, "skipped", 1.0))
            if rng.random() < 0.4:  # the sentinel's step after
                self.step += 1
                sentinel += self._sentinel(self.step)
        if rng.random() < 0.2:  # rows in any order
            rng.shuffle(recorded)
        chunks = [self._chunk(recorded, sentinel=False)]
        if sentinel:
            chunks.append(self._chunk(sentinel, sentinel=True))
        return chunks, scalars

    def _identity(
        self, phase: str, info: ModuleInfo, kind: Kind, tensor: str, call: int
    ) -> Identity:
        return Identity(phase, info.name, info.type, kind, tensor, call)

    def _step(self, step: int, phase: str) -> list[tuple[int, Identity, dict[str, float]]]:
        rng = self.rng
        rows = []
        for info in self.infos:
            name = info.name
            if rng.random() < 0.1:
                self.dead ^= {name}
            calls = 2 if rng.random() < 0.1 else 1
            for call in range(calls):
                for kind in (Kind.INPUT, Kind.ACTIVATION, Kind.GRAD):
                    if kind is Kind.INPUT and rng.random() < 0.7:
                        continue
                    stats = self._values(name, kind.value, "output")
                    if kind is Kind.ACTIVATION and name in self.dead:
                        stats["zero_frac"] = 1.0 if rng.random() < 0.8 else 0.9
                    rows.append((step, self._identity(phase, info, kind, "output", call), stats))
            if phase != "train":
                continue
            for tensor in _PARAMETERS.get(info.type, ()):
                weight = self.weights.get(f"{name}.{tensor}")
                if weight is None or rng.random() < 0.7:
                    weight = self._values(name, "weight", tensor)
                    self.weights[f"{name}.{tensor}"] = weight
                rows.append(
                    (step, self._identity(phase, info, Kind.WEIGHT, tensor, 0), dict(weight))
                )
                grad = self._values(name, "weight_grad", tensor)
                rows.append((step, self._identity(phase, info, Kind.WEIGHT_GRAD, tensor, 0), grad))
                if rng.random() < 0.8:
                    update = self._values(name, "update", tensor)
                    if rng.random() < 0.1:
                        update["l2"] = 0.0
                    rows.append((step, self._identity(phase, info, Kind.UPDATE, tensor, 0), update))
        return rows

    def _values(self, module: str, kind: str, tensor: str) -> dict[str, float]:
        rng = self.rng
        key = (module, kind + tensor)
        scale = self.scale.get(key, 10 ** rng.uniform(-4, 1))
        if rng.random() < 0.15:  # a jump by orders of magnitude, up or down
            scale *= 10 ** rng.choice((-6, -4, -3, 3, 4, 6))
        self.scale[key] = scale
        rms = scale * math.exp(rng.gauss(0, 0.2))
        numel = float(rng.choice((1, 12, 64, 64, 64, 100)))
        nan = 1 if rng.random() < 0.02 else 0
        inf = 1 if rng.random() < 0.02 else 0
        return {
            "mean": rng.gauss(0, rms), "std": rms, "min": -3 * rms, "max": 3 * rms,
            "absmax": 3 * rms, "l2": 0.0 if rng.random() < 0.03 else rms * numel**0.5,
            "zero_frac": rng.random() * 0.5, "numel": numel, "nan_count": nan, "inf_count": inf,
            "dead_units": rng.random() if rng.random() < 0.9 else math.nan,
        }  # fmt: skip

    def _sentinel(self, step: int) -> list[tuple[int, Identity, dict[str, float]]]:
        rows = []
        for info in self.infos:
            for tensor in _PARAMETERS.get(info.type, ()):
                rms = self._values(info.name, "weight_grad", tensor)["std"]
                low = math.nan if self.rng.random() < 0.03 else -3 * rms
                stats = {"numel": 64.0, "min": low, "max": 3 * rms, "absmax": 3 * rms}
                rows.append(
                    (step, self._identity("train", info, Kind.WEIGHT_GRAD, tensor, 0), stats)
                )
        return rows

    def _chunk(
        self, rows: list[tuple[int, Identity, dict[str, float]]], sentinel: bool
    ) -> StatsRows:
        identities = self.identities
        names = ("numel", "min", "max", "absmax") if sentinel else (
            "numel", "mean", "std", "min", "max", "absmax", "l2", "zero_frac", "nan_count",
            "inf_count",
        )  # fmt: skip
        stats = {
            name: torch.tensor(
                [row[name] for _, _, row in rows],
                dtype=torch.int64 if name in _COUNTS else torch.float64,
            )
            for name in names
        }
        custom = {}
        if not sentinel:
            custom["dead_units"] = [
                None if math.isnan(row["dead_units"]) else row["dead_units"] for _, _, row in rows
            ]
        step = torch.tensor([step for step, _, _ in rows], dtype=torch.int64)
        codes = torch.tensor(
            [identities.code(identity) for _, identity, _ in rows], dtype=torch.int64
        )
        form = identities.form_code(Form("float32", (8, 8)))
        return StatsRows(
            step,
            codes,
            torch.full_like(step, form),
            identities,
            0,
            stats,
            custom,
            sentinel=sentinel,
        )
