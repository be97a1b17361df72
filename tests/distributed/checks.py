"""Comparisons the DDP and FSDP2 tests share: rows against references, runs against runs."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

KEY = ["step", "module", "kind", "tensor"]
STATS = ["numel", "mean", "std", "min", "max", "l2"]
RTOL = 1e-6  # float32 values summed in float64 on both sides


def loaded_stats(job: Any) -> pd.DataFrame:
    """The rows ``layerscope.load`` read on rank 0, after every rank closed its scope."""
    return pd.DataFrame(job.read("loaded.json")["stats"])


def rows_of(stats: pd.DataFrame, rank: int) -> dict[tuple[Any, ...], dict[str, Any]]:
    """One rank's rows by (step, module, kind, tensor); fails if a key repeats."""
    mine = stats[stats["rank"] == rank]
    keyed = mine.set_index(KEY)
    assert keyed.index.is_unique, f"rank {rank} has repeated rows"
    return keyed.to_dict("index")


def mismatches(expected: dict[str, Any], row: dict[str, Any], names: list[str]) -> list[str]:
    """The statistics in ``names`` where ``row`` differs from ``expected`` (NaN equals NaN)."""
    wrong = []
    for name in names:
        want, got = expected[name], row.get(name)
        if want is None or (isinstance(want, float) and math.isnan(want)):
            same = got is None or (isinstance(got, float) and math.isnan(got))
        else:
            same = got is not None and math.isclose(got, want, rel_tol=RTOL, abs_tol=1e-12)
        if not same:
            wrong.append(f"{name}: expected {want!r}, recorded {got!r}")
    return wrong


def compare_with_expected(
    stats: pd.DataFrame, ranks: list[dict[str, Any]], names: list[str], kinds: set[str]
) -> None:
    """Every expected row of ``kinds`` is there on its rank and holds the expected ``names``."""
    problems = []
    for result in ranks:
        rank = result["rank"]
        recorded = rows_of(stats, rank)
        for expected in result["expected"]:
            if expected["kind"] not in kinds:
                continue
            key = tuple(expected[k] for k in KEY)
            row = recorded.get(key)
            if row is None:
                problems.append(f"rank {rank} {key}: no row")
                continue
            problems += [f"rank {rank} {key}: {w}" for w in mismatches(expected, row, names)]
    assert not problems, "\n".join(problems)


def assert_same_collectives(ranks: list[dict[str, Any]]) -> None:
    """Per rank, the watched run issued what the unwatched run did, in order, and trained alike."""
    for result in ranks:
        rank, plain, watched = result["rank"], result["plain"], result["watched"]
        assert plain["collectives"], f"rank {rank}: the log saw no collective at all"
        assert watched["collectives"] == plain["collectives"], (
            f"rank {rank}: collectives on the training thread differ\n"
            f"unwatched: {plain['collectives']}\nwatched:   {watched['collectives']}"
        )
        # The flight recorder sees every thread and process group, the writer's included.
        assert watched["flight_recorder"] == plain["flight_recorder"], (
            f"rank {rank}: the flight recorder saw different collectives\n"
            f"unwatched: {plain['flight_recorder']}\nwatched:   {watched['flight_recorder']}"
        )
        assert watched["params"] == plain["params"], f"rank {rank}: training changed"


def assert_log_matches_flight_recorder(result: dict[str, Any]) -> None:
    """The dispatch-mode log saw each collective the flight recorder saw, no more, no fewer."""
    plain = result["plain"]
    recorded = plain["flight_recorder"]
    assert all(this_thread for _, _, this_thread in recorded)
    assert len(plain["collectives"]) == len(recorded), (plain["collectives"], recorded)
