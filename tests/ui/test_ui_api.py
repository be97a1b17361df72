"""The JSON API against a real server: each answer checked against the run read independently."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from ui_runs import XSS_NAME

import layerscope
from layerscope.ui._encode import unpack


def train_rows(run, kind, tensor, rank=0):
    """The rows a chart shows, from the whole stats table (pandas, not SQL)."""
    stats = run.stats
    return stats[
        (stats["kind"] == kind)
        & (stats["tensor"] == tensor)
        & (stats["phase"] == "train")
        & (stats["rank"] == rank)
        & (stats["call"] == 0)
        & ~stats["sentinel"].fillna(False).astype(bool)
    ]


def test_runs_listing_is_what_is_on_disk(server, runs_root):
    listing = server.json("/api/runs")["runs"]
    on_disk = sorted(p.name for p in runs_root.iterdir() if (p / "run.json").exists())
    assert sorted(entry["id"] for entry in listing) == on_disk == ["exp1", "exp2", "ranks", "xss"]
    for entry in listing:
        run = layerscope.load(runs_root / entry["id"])
        assert entry["status"] == run.meta["status"] == "finished"
        assert entry["ranks"] == len(run.meta["ranks"])
        assert entry["steps"] == run.meta["steps"]
        assert entry["alerts"] == len(run.alerts)
    assert {entry["id"]: entry["alerts"] for entry in listing}["exp1"] == 1


def test_summary_names_what_was_recorded(server):
    summary = server.json("/api/runs/exp1")
    assert summary["steps"] == 6
    assert summary["ranks"] == [0]
    assert summary["kinds"]["activation"] == ["out"]
    assert summary["kinds"]["weight"][0] == "weight"  # the figures' default tensor first
    assert set(summary["kinds"]["weight"]) == {"weight", "bias"}
    assert "absmax" in summary["stats"]
    assert "hist" not in summary["stats"]
    assert summary["overhead"]["cost_seconds"] > 0
    assert summary["overhead"]["kernel"]


@pytest.mark.parametrize("stat", ["absmax", "std", "zero_frac"])
def test_heat_map_equals_the_stored_values(server, runs_root, stat):
    answer = server.json(f"/api/runs/exp1/heatmap?kind=activation&stat={stat}")
    assert not answer["downsampled"]
    assert answer["width"] == 1
    rows = train_rows(layerscope.load(runs_root / "exp1"), "activation", "out")
    assert answer["layers"] == ["0", "1", "2"]
    assert answer["steps"] == sorted(rows["step"].unique().tolist()) == list(range(6))
    values = unpack(answer["values"])
    for row, layer in enumerate(answer["layers"]):
        expected = rows[rows["module"] == layer].sort_values("step")[stat].to_numpy(np.float64)
        np.testing.assert_allclose(values[row], expected, rtol=1e-6)


def test_heat_map_downsamples_steps_and_says_how(server, runs_root):
    # 6 steps in at most 4 columns: columns of 2 steps, absmax their max, std their mean.
    run = layerscope.load(runs_root / "exp1")
    rows = train_rows(run, "grad", "out").assign(bucket=lambda frame: frame["step"] // 2)
    for stat, reduce in [("absmax", "max"), ("std", "mean"), ("min", "min")]:
        answer = server.json(f"/api/runs/exp1/heatmap?kind=grad&stat={stat}&columns=4")
        assert answer["downsampled"]
        assert answer["width"] == 2
        assert answer["aggregate"] == {"mean": "avg"}.get(reduce, reduce)
        assert answer["steps"] == [0, 2, 4]
        assert answer["last_steps"] == [1, 3, 5]
        expected = rows.groupby(["module", "bucket"])[stat].agg(reduce).unstack()
        values = unpack(answer["values"])
        for row, layer in enumerate(answer["layers"]):
            np.testing.assert_allclose(values[row], expected.loc[layer].to_numpy(), rtol=1e-6)


def test_series_of_a_layer_equals_its_rows(server, runs_root):
    answer = server.json("/api/runs/exp1/series?kind=weight&tensor=bias&module=2")
    rows = train_rows(layerscope.load(runs_root / "exp1"), "weight", "bias")
    rows = rows[rows["module"] == "2"].sort_values("step")
    assert answer["steps"] == rows["step"].tolist()
    for stat in ["mean", "l2", "max"]:
        np.testing.assert_allclose(
            unpack(answer["stats"][stat]), rows[stat].to_numpy(np.float64), rtol=1e-6
        )


def widened(row):
    """A row's histogram as ``run.stats`` gives it: all 256 slots."""
    counts = np.asarray(row["hist"], dtype=np.float64)
    assert counts.shape == (256,)
    return counts


def test_color_dim_and_distribution_equal_the_histograms(server, runs_root):
    run = layerscope.load(runs_root / "exp1")
    rows = train_rows(run, "activation", "out")
    rows = rows[rows["module"] == "1"].sort_values("step")
    edges = np.asarray(run.meta["histogram_edges"])
    colour = server.json("/api/runs/exp1/colordim?kind=activation&module=1")
    assert colour["steps"] == rows["step"].tolist()
    # Reconstruct each step's full histogram from the answer: the shown magnitude slots,
    # the zeros, the infinities.
    slot_of = {int(e): int(np.flatnonzero(edges == 2.0**e)[0]) for e in colour["exponents"]}
    counts = unpack(colour["counts"])
    for column, (_, row) in enumerate(rows.iterrows()):
        expected = widened(row)
        assert sum(expected) == row["numel"] - row["nan_count"] or sum(expected) == row["numel"]
        got = np.zeros(256)
        for index, exponent in enumerate(colour["exponents"]):
            got[slot_of[exponent]] = counts[index, column]
        got[0], got[-1] = colour["zeros"][column], colour["infinite"][column]
        np.testing.assert_array_equal(got, expected)
        assert colour["totals"][column] == expected.sum()
    step = int(rows["step"].iloc[2])
    shown = server.json(f"/api/runs/exp1/distribution?kind=activation&module=1&step={step}")
    expected = widened(rows.iloc[2])
    assert shown["step"] == step
    assert shown["total"] == expected.sum()
    assert math.isclose(shown["zeros"], expected[0] / expected.sum())
    for exponent, fraction in zip(shown["exponents"], shown["fractions"], strict=True):
        slot = int(np.flatnonzero(edges == 2.0**exponent)[0])
        assert math.isclose(fraction, expected[slot] / expected.sum(), rel_tol=1e-12)
    missing = server.json("/api/runs/exp1/distribution?kind=activation&module=1&step=999")
    assert missing["step"] is None


def test_scalars_and_alerts_equal_the_tables(server, runs_root):
    run = layerscope.load(runs_root / "exp1")
    scalars = server.json("/api/runs/exp1/scalars")["scalars"]
    stored = run.scalars
    loss = stored[stored["name"] == "loss"].sort_values("step")
    assert scalars["loss"]["steps"] == loss["step"].tolist()
    expected = [None if not math.isfinite(v) else v for v in loss["value"]]
    assert scalars["loss"]["values"] == pytest.approx(expected, nan_ok=True)
    alerts = server.json("/api/runs/exp1/alerts")["alerts"]
    assert [(a["step"], a["rule"], a["module"]) for a in alerts] == [
        (int(r.step), r.rule, r.module) for r in run.alerts.itertuples()
    ]
    assert alerts[0]["rule"] == "nonfinite"
    assert alerts[0]["step"] == 3


def test_module_tree(server, runs_root):
    modules = server.json("/api/runs/exp1/modules")["modules"]
    assert [m["name"] for m in modules] == ["", "0", "1", "2"]
    assert modules[1]["type"] == "Linear"
    assert modules[1]["parameters"] == {"weight": [8, 4], "bias": [8]}
    assert modules[0]["num_parameters_total"] == 8 * 4 + 8 + 3 * 8 + 3


def test_a_module_named_like_html_is_plain_json_text(server):
    _, headers, body = server.get("/api/runs/xss/heatmap?kind=activation")
    assert headers["content-type"] == "application/json"
    assert headers["x-content-type-options"] == "nosniff"
    answer = json.loads(body)
    assert answer["layers"] == ["first", XSS_NAME, "last"]
    names = [m["name"] for m in server.json("/api/runs/xss/modules")["modules"]]
    assert XSS_NAME in names
    series = server.json(
        "/api/runs/xss/series?kind=activation&module=%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E"
    )
    assert series["module"] == XSS_NAME
    assert len(series["steps"]) == 2


@pytest.mark.parametrize(
    ("query", "argument"),
    [
        ("heatmap?stat=nope", "stat"),
        ("heatmap?kind=nope", "kind"),
        ("heatmap?phase=nope", "phase"),
        ("heatmap?rank=x", "rank"),
        ("heatmap?columns=0", "columns"),
        ("series?module=nope", "module"),
        ("series", "module"),
        ("heatmap?stat=absmax'%20or%201=1--", "stat"),
    ],
)
def test_bad_arguments_are_400_naming_the_argument(server, query, argument):
    status, _, body = server.get(f"/api/runs/exp1/{query}")
    assert status == 400
    assert json.loads(body)["error"].startswith(argument)


def test_each_rank_of_a_run_written_by_two(server, runs_root):
    assert server.json("/api/runs/ranks")["ranks"] == [0, 1]
    run = layerscope.load(runs_root / "ranks")
    for rank, steps in [(0, 3), (1, 4)]:
        answer = server.json(f"/api/runs/ranks/heatmap?kind=grad&stat=l2&rank={rank}")
        assert answer["rank"] == rank
        assert answer["steps"] == list(range(steps))
        rows = train_rows(run, "grad", "out", rank=rank)
        values = unpack(answer["values"])
        for row, layer in enumerate(answer["layers"]):
            expected = rows[rows["module"] == layer].sort_values("step")["l2"]
            np.testing.assert_allclose(values[row], expected.to_numpy(np.float64), rtol=1e-6)
        loss = server.json(f"/api/runs/ranks/scalars?rank={rank}")["scalars"]["loss"]
        assert loss["steps"] == list(range(steps))
    rank_0 = unpack(server.json("/api/runs/ranks/heatmap?kind=grad&stat=l2&rank=0")["values"])
    rank_1 = unpack(server.json("/api/runs/ranks/heatmap?kind=grad&stat=l2&rank=1")["values"])
    assert not np.allclose(rank_0, rank_1[:, :3])  # other batches: other gradients
