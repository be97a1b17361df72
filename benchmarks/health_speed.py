"""The health rules' cost per flush, on synthetic rows of a large model.

    python benchmarks/health_speed.py            # prints the figures (BENCHMARKS.md)
    python benchmarks/health_speed.py --small    # a small model's flushes: 4 blocks, 10 steps

A model shaped like the overhead benchmark's ``scale`` workload (250 residual blocks of Linear,
LayerNorm, GELU and Dropout: 1,251 modules), every other step recorded with activations,
output gradients, weights, weight gradients and updates, the steps between read by the
gradients' sentinel; a flush holds 2 recorded steps and the sentinel's rows between (13,004
rows). Its statistics are healthy random values but for planted pathologies that every rule
finds: a layer that dies, a parameter gradient that explodes, a parameter the optimizer leaves
out, an activation that grows a thousandfold, a NaN, and a loss spike. The figures are the
monitor's own thread time (``HealthMonitor.seconds``) per flush, the median and the mean (the
mean takes in the flush where the loss spikes and its rule reads back every layer's recent
scales), and per row, after one warm-up flush; and the median wall time per flush.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator

import torch

from layerscope.health import HealthMonitor, parse_alerts
from layerscope.model._identities import Form, Identities, Identity
from layerscope.model._kinds import Kind
from layerscope.model._modules import ModuleInfo
from layerscope.model._rows import StatsRows

BLOCKS = 250
STEPS_PER_FLUSH = 2  # recorded steps; the sentinel reads the steps between
_STATS = ("mean", "std", "min", "max", "absmax", "l2", "zero_frac")
_COUNTS = ("numel", "nan_count", "inf_count")
# The planted pathologies: which tensor, and the recorded step they start at.
DEAD = "blocks.40.act"  # its output all zeros from step 20
EXPLODING = "blocks.7.linear"  # its weight gradient 1e5 times too large from step 30
LEFT_OUT = "blocks.100.norm"  # never updated
GROWING = "blocks.200.linear"  # its output 1,000 times larger from step 24
NAN_AT = ("blocks.150.linear", 36)  # a NaN in its output at that step
SPIKE_AT = 44  # the loss jumps there


def modules() -> list[ModuleInfo]:
    """The model's modules in ``named_modules()`` order."""
    infos = [ModuleInfo("", "Scale", {}, 0, 0, (), True)]
    for block in range(BLOCKS):
        name = f"blocks.{block}"
        parts = {"linear": "Linear", "norm": "LayerNorm", "act": "GELU", "drop": "Dropout"}
        infos.append(ModuleInfo(name, "Block", {}, 0, 0, (), True))
        for part, kind in parts.items():
            infos.append(ModuleInfo(f"{name}.{part}", kind, {}, 0, 0, (), True))
    return infos


def _params(info: ModuleInfo) -> tuple[str, ...]:
    return {"Linear": ("weight", "bias"), "LayerNorm": ("weight", "bias")}.get(info.type, ())


def _rows(
    identities: Identities, keys: list[tuple[int, Identity]], values: dict[str, list[float]]
) -> dict[str, torch.Tensor]:
    codes = [identities.code(identity) for _, identity in keys]
    columns = {"step": torch.tensor([step for step, _ in keys]), "identity": torch.tensor(codes)}
    for name, column in values.items():
        dtype = torch.int64 if name in _COUNTS else torch.float64
        columns[name] = torch.tensor(column, dtype=dtype)
    return columns


def _chunk(identities: Identities, columns: dict[str, torch.Tensor], sentinel: bool) -> StatsRows:
    form = identities.form_code(Form("float32", (64, 64)))
    step, identity = columns.pop("step"), columns.pop("identity")
    return StatsRows(
        step, identity, torch.full_like(step, form), identities, 0, columns, sentinel=sentinel
    )


def _recorded(step: int, infos: list[ModuleInfo], generator: torch.Generator) -> list[tuple]:
    """(identity, rms, zero fraction, nan count) of every row of a recorded step."""
    noise = torch.exp(0.1 * torch.randn(6 * len(infos), generator=generator)).tolist()
    rows = []
    for i, info in enumerate(infos):
        name, wiggle = info.name, noise[6 * i : 6 * i + 6]
        act = 1000.0 if name == GROWING and step >= 24 else 1.0
        dead = name == DEAD and step >= 20
        nan = 1 if (name, step) == NAN_AT else 0
        zero = 1.0 if dead else (0.5 if info.type == "GELU" else 0.0)
        rows.append((Identity("train", name, info.type, Kind.ACTIVATION, "output", 0),
                     act * wiggle[0], zero, nan))  # fmt: skip
        rows.append((Identity("train", name, info.type, Kind.GRAD, "output", 0),
                     1e-3 * wiggle[1], zero, 0))  # fmt: skip
        for j, tensor in enumerate(_params(info)):
            scale = 1e5 if name == EXPLODING and tensor == "weight" and step >= 30 else 1.0
            update = 0.0 if name == LEFT_OUT else 1e-3
            for kind, rms in ((Kind.WEIGHT, 0.05 * (1 + 0.001 * step)),
                              (Kind.WEIGHT_GRAD, scale * 1e-4 * wiggle[2 + j]),
                              (Kind.UPDATE, update * 0.05 * wiggle[4 + j])):  # fmt: skip
                rows.append((Identity("train", name, info.type, kind, tensor, 0), rms, 0.0, 0))
    return rows


def flushes(count: int, seed: int = 0) -> Iterator[tuple[list[StatsRows], list[tuple]]]:
    """``count`` flushes: each its chunks (recorded rows, the sentinel's) and its scalars."""
    infos, identities = modules(), Identities()
    generator = torch.Generator().manual_seed(seed)
    numel = 4096.0
    for flush in range(count):
        keys, values = [], {name: [] for name in (*_STATS, *_COUNTS)}
        sentinel_keys, sentinel_values = [], {"numel": [], "min": [], "max": [], "absmax": []}
        scalars = []
        for offset in range(STEPS_PER_FLUSH):
            step = 2 * (flush * STEPS_PER_FLUSH + offset)
            for identity, rms, zero, nan in _recorded(step, infos, generator):
                keys.append((step, identity))
                row = {"mean": 0.0, "std": rms, "min": -3 * rms, "max": 3 * rms,
                       "absmax": 3 * rms, "l2": rms * numel**0.5, "zero_frac": zero,
                       "numel": numel, "nan_count": nan, "inf_count": 0}  # fmt: skip
                for name, value in row.items():
                    values[name].append(value)
            for identity, rms, _, _ in _recorded(step + 1, infos, generator):
                if identity.kind is Kind.WEIGHT_GRAD:  # the sentinel's step between
                    sentinel_keys.append((step + 1, identity))
                    for name, value in (("numel", numel), ("min", -3 * rms), ("max", 3 * rms),
                                        ("absmax", 3 * rms)):  # fmt: skip
                        sentinel_values[name].append(value)
            for at in (step, step + 1):
                loss = 2.0 * 0.99**at + 0.01 * (at % 3) + (10.0 if at == SPIKE_AT else 0.0)
                scalars.append((at, "loss", loss))
        chunks = [_chunk(identities, _rows(identities, keys, values), sentinel=False)]
        sentinel = _rows(identities, sentinel_keys, sentinel_values)
        chunks.append(_chunk(identities, sentinel, sentinel=True))
        yield chunks, scalars


def measure(count: int) -> dict[str, object]:
    """Run the default rules over ``count`` flushes (the first a warm-up); their cost."""
    monitor = HealthMonitor(parse_alerts(True), modules())
    data = list(flushes(count))
    alerts = list(monitor.observe(*data[0]))
    monitor.seconds, monitor.rows, monitor.flushes = 0.0, 0, 0  # the warm-up flush is left out
    seconds, walls = [], []
    for chunks, scalars in data[1:]:
        before, started = monitor.seconds, time.perf_counter()
        alerts += monitor.observe(chunks, scalars)
        walls.append(time.perf_counter() - started)
        seconds.append(monitor.seconds - before)
    return {
        "median_ms": 1e3 * statistics.median(seconds),
        "median_wall_ms": 1e3 * statistics.median(walls),
        "alerts": alerts,
        "flushes": monitor.flushes,
        "rows_per_flush": monitor.rows / monitor.flushes,
        "per_flush_ms": 1e3 * monitor.seconds / monitor.flushes,
        "per_row_us": 1e6 * monitor.seconds / monitor.rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--flushes", type=int, default=20)
    parser.add_argument("--small", action="store_true", help="4 blocks, 10 steps a flush")
    args = parser.parse_args()
    if args.small:  # many steps of few rows: the rules' cost per step, not per row
        global BLOCKS, STEPS_PER_FLUSH
        BLOCKS, STEPS_PER_FLUSH = 4, 10
    result = measure(args.flushes)
    found = sorted({(a.rule, a.module, a.step) for a in result["alerts"]})  # type: ignore[attr-defined]
    text = (
        f"{result['flushes']} flushes of {result['rows_per_flush']:.0f} rows: "
        f"{result['median_ms']:.2f} ms per flush (median; mean {result['per_flush_ms']:.2f} ms, "
        f"wall {result['median_wall_ms']:.2f} ms), {result['per_row_us']:.2f} us per row. "
        f"Alerts: " + "; ".join(f"{rule} {module} step {step}" for rule, module, step in found)
    )
    print(text)


if __name__ == "__main__":
    main()
