"""``load(path, max_frame_rows=...)``: a table too large for one DataFrame is refused, counted."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import layerscope
from layerscope.store import MAX_FRAME_ROWS, FrameTooLargeError

pytest.importorskip("duckdb")

STEPS = 4
SHORT = 2  # rank 1 records fewer steps: its rows are not a half of the job's
MODULES = 2  # Linear, ReLU: activations and output gradients, 2 tensors a step each
STORED = (STEPS + SHORT) * MODULES * 2
MERGED = STEPS * MODULES * 2


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """A run of two ranks (written in turn), four recorded steps, and what each table holds."""
    path = tmp_path_factory.mktemp("limit") / "run"
    with pytest.MonkeyPatch.context() as patch:
        for rank in (0, 1):
            patch.setenv("RANK", str(rank))
            patch.setenv("WORLD_SIZE", "2")
            torch.manual_seed(0)
            net = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
            with layerscope.watch(
                net, run=path, every=1, kinds=("activation", "grad"), alerts=False
            ) as scope:
                for _ in range(STEPS if rank == 0 else SHORT):
                    net(torch.randn(5, 3)).sum().backward()
                    scope.step(loss=1.0)
    return path


def test_a_table_of_more_rows_than_the_limit_is_refused_with_its_count(job):
    rows = STORED
    assert len(layerscope.load(job, max_frame_rows=rows).stats) == rows
    with pytest.raises(FrameTooLargeError) as raised:
        _ = layerscope.load(job, max_frame_rows=rows - 1).stats
    error = raised.value
    assert (error.table, error.rows, error.limit) == ("stats", rows, rows - 1)
    message = str(error)
    assert f"run.stats: {rows} rows, more than the max_frame_rows={rows - 1}" in message
    assert 'run.sql("select step, module, l2 from stats where' in message
    assert "max_frame_rows=None" in message


def test_no_limit_takes_every_row_and_sql_answers_whatever_the_limit(job):
    run = layerscope.load(job, max_frame_rows=1)
    assert run.sql("select count(*) as n from stats")["n"][0] == STORED
    assert run.sql("select count(*) as n from merged_stats")["n"][0] == MERGED
    assert len(layerscope.load(job, max_frame_rows=None).stats) == STORED


def test_merged_rows_are_counted_as_merged(job):
    assert len(layerscope.load(job, ranks="merge", max_frame_rows=MERGED).stats) == MERGED
    # Stored rows over the limit, half of them not: counted by the query, to the limit's one
    # more.
    with pytest.raises(FrameTooLargeError, match=r"at least 14 merged rows") as raised:
        _ = layerscope.load(job, ranks="merge", max_frame_rows=13).stats
    assert raised.value.rows == 14
    # Half the stored rows (two ranks) over the limit: refused before anything is merged.
    with pytest.raises(FrameTooLargeError, match=r"at least 12 merged rows.*merged_stats"):
        _ = layerscope.load(job, ranks="merge", max_frame_rows=11).stats


def test_every_table_is_held_to_the_limit(job):
    run = layerscope.load(job, max_frame_rows=STEPS + SHORT - 1)
    with pytest.raises(FrameTooLargeError, match=rf"run\.scalars: {STEPS + SHORT} rows"):
        _ = run.scalars
    # calls stores a repeated order once: counted as handed over, every step's events.
    calls = len(layerscope.load(job).calls)
    assert calls == (STEPS + SHORT) * MODULES * 2  # steps of each rank x modules x (enter, exit)
    with pytest.raises(FrameTooLargeError, match=rf"run\.calls: {calls} rows"):
        _ = layerscope.load(job, max_frame_rows=calls - 1).calls


@pytest.mark.parametrize(
    ("value", "error", "expected"),
    [
        (0, ValueError, "max_frame_rows: expected a positive int or None, got 0"),
        (2.5, TypeError, "max_frame_rows: expected a positive int or None, got float"),
        (True, TypeError, "max_frame_rows: expected a positive int or None, got bool"),
    ],
)
def test_the_limit_must_be_a_positive_int_or_none(job, value, error, expected):
    with pytest.raises(error, match=expected):
        layerscope.load(job, max_frame_rows=value)


def test_the_default_limit_is_a_million_rows(job):
    assert layerscope.load(job).max_frame_rows == MAX_FRAME_ROWS == 1_000_000
