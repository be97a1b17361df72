"""benchmarks/overhead.py derives the defaults' cost with update rows from its own rows."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"


@pytest.fixture
def overhead():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import overhead

        yield overhead
    finally:
        sys.path.remove(str(BENCHMARKS))


def _row(text: str, label: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(f"| {label} |"))
    return [cell.strip() for cell in line.strip("|").split("|")[1:]]


def test_defaults_with_update_mix_the_idle_and_recorded_steps_that_capture_update(overhead):
    every = overhead.DEFAULT_SCHEDULE.every
    times = {
        "unwatched": 1.0,
        overhead.SECOND_COPY: 1.0,
        overhead.IDLE: 1.0,
        overhead.FULL: 2.0,
        overhead.IDLE_UPDATE: 1.5,
        overhead.FULL_UPDATE: 11.5,
    }
    text = overhead.table({"mlp": times}, {"mlp": 4})
    long_run = (1 - 1 / every) * 1.5 + 11.5 / every
    assert _row(text, "layerscope: defaults with update, long run (derived)") == [
        f"{long_run:.3f}x"
    ]
    # The rows without update still read the plain configurations.
    plain = (1 - 1 / every) * 1.0 + 2.0 / every
    assert _row(text, "layerscope: defaults, long run (derived)") == [f"{plain:.3f}x"]
    assert overhead.WITH_UPDATE == ["activation", "grad", "weight", "weight_grad", "update"]
