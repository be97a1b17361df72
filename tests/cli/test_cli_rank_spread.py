"""``layerscope summary`` of a job of several ranks: the spread across ranks and the job's cost."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from torch import nn

import layerscope
from layerscope.cli import main
from layerscope.cli._rank_spread import rank_spread

pytest.importorskip("duckdb")
STEPS = 3
SCALES = {0: 1.0, 1: 10.0}  # rank 1's data is ten times larger: its activations stand apart


def _train(run: Path, rank: int, monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    """One rank of a two-rank job, as torchrun's environment says; each module's last L2."""
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "2")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    sgd = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(rank)
    last: dict[str, float] = {}
    for name in ("0", "2"):
        model.get_submodule(name).register_forward_hook(
            lambda m, i, out, name=name: last.__setitem__(name, out.double().norm().item())
        )
    with layerscope.watch(model, sgd, run=str(run), every=1):
        for _ in range(STEPS):
            x = torch.randn(16, 4, generator=generator) * SCALES[rank]
            model(x).pow(2).mean().backward()
            sgd.step()
            sgd.zero_grad()
    return last


@pytest.fixture
def job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, dict[int, dict[str, float]]]:
    run = tmp_path / "job"
    norms = {rank: _train(run, rank, monkeypatch) for rank in (0, 1)}
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    return run, norms


def test_the_spread_names_the_rank_that_stands_apart_with_float64_norms(job) -> None:
    run, norms = job
    loaded = layerscope.load(run)
    spread = rank_spread(
        loaded, "train", frozenset(loaded.sql("select * from stats limit 0").columns)
    )
    rows = spread[spread.kind == "activation"].set_index("module")
    assert set(spread.step) == {STEPS - 1}
    for module in ("0", "2"):
        row = rows.loc[module]
        assert (row.low_rank, row.high_rank, row.ranks) == (0, 1, 2)
        assert row.high == pytest.approx(norms[1][module], rel=1e-5)
        assert row.low == pytest.approx(norms[0][module], rel=1e-5)
        assert row["median"] == pytest.approx((norms[0][module] + norms[1][module]) / 2, rel=1e-5)
    # Parameters are the same on every rank after DDP's all-reduce: never in the spread.
    assert not {"weight", "weight_grad"} & set(spread.kind)


def test_the_summary_says_which_rank_it_shows_and_what_the_job_cost(job, capsys) -> None:
    run, _ = job
    assert main(["summary", str(run), "--plain"]) == 0
    out = capsys.readouterr().out
    assert "layers (phase train, rank 0 of 2: --rank N shows another" in out
    assert "spread across 2 ranks (step 2" in out
    recorded = sum(
        json.loads(path.read_text())["recorded_rows"]
        for path in (run / "run.json", run / "rank-00001" / "run.json")
    )
    assert (
        f"stats rows       {recorded} recorded, {recorded} written, 0 dropped, over 2 ranks" in out
    )
    assert "the most of 2 ranks" in out


def test_a_run_of_one_rank_has_no_spread(tmp_path: Path, capsys) -> None:
    model = nn.Linear(3, 1)
    with layerscope.watch(model, run=str(tmp_path / "one"), every=1) as scope:
        model(torch.randn(2, 3)).sum().backward()
        scope.step()
    assert main(["summary", str(tmp_path / "one"), "--plain"]) == 0
    out = capsys.readouterr().out
    assert "spread across" not in out
    assert "layers (phase train, rank 0, step 0)" in out


def test_the_scalars_shown_are_those_of_the_rank_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    run = tmp_path / "job"
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        model = nn.Linear(3, 1)
        with layerscope.watch(model, run=str(run), every=1) as scope:
            for step in range(2 + rank):
                model(torch.randn(2, 3)).sum().backward()
                scope.step(loss=100.0 * rank + step)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    shown = {}
    for rank in (0, 1):
        assert main(["summary", str(run), "--plain", "--rank", str(rank)]) == 0
        shown[rank] = capsys.readouterr().out
    assert re.search(r"loss +1 at step 1 \(0 at step 0\)", shown[0])
    assert re.search(r"loss +102 at step 2 \(100 at step 0\)", shown[1])
