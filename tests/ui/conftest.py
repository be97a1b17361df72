"""A folder of small real runs, and one dashboard server over it for each test module."""

from __future__ import annotations

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("plotly")

from ui_runs import Server, record, xss_model


@pytest.fixture(scope="session")
def runs_root(tmp_path_factory):
    """``exp1`` (6 steps, a NaN at step 3: one alert), ``exp2`` (4 steps), ``xss``, and
    ``ranks``, written by two ranks (3 steps of rank 0, 4 of rank 1)."""
    root = tmp_path_factory.mktemp("ui") / "runs"
    record(root / "exp1", 6, nan_at=3)
    record(root / "exp2", 4)
    record(root / "xss", 2, model=xss_model())
    with pytest.MonkeyPatch.context() as patch:
        for rank in (0, 1):  # as torchrun would launch them: the rank in the environment
            patch.setenv("RANK", str(rank))
            patch.setenv("WORLD_SIZE", "2")
            record(root / "ranks", 3 + rank, seed=rank)
    return root


@pytest.fixture(scope="module")
def server(runs_root):
    with Server(runs_root) as running:
        yield running
