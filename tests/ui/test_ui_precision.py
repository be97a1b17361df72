"""The dashboard's fraction lost per low-precision format: a statistic of the heat map.

``{fmt}_lost`` is checked against the stored counts read with pandas, and they against the
float64 reference in tests/stats and tests/store.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import layerscope
from layerscope.ui._encode import unpack

FORMATS = ("e4m3", "e5m2", "fp16", "bf16")


def lost_rows(run, kind, tensor, fmt):
    stats = run.stats
    rows = stats[
        (stats["kind"] == kind)
        & (stats["tensor"] == tensor)
        & (stats["phase"] == "train")
        & (stats["rank"] == 0)
        & (stats["call"] == 0)
        & ~stats["sentinel"].fillna(False).astype(bool)
    ].copy()
    rows["lost"] = (rows[f"{fmt}_over"] + rows[f"{fmt}_under"]) / rows["numel"]
    return rows


def test_the_formats_are_offered_beside_the_stored_statistics(server):
    stats = server.json("/api/runs/exp1")["stats"]
    assert [name for name in stats if name.endswith("_lost")] == [f"{f}_lost" for f in FORMATS]
    # The counts themselves are not offered: a report holds a heat map of each statistic.
    assert not any(name.startswith(FORMATS) and not name.endswith("_lost") for name in stats)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", ["grad", "weight_grad"])
def test_heat_map_of_the_fraction_lost_equals_the_stored_counts(server, runs_root, fmt, kind):
    answer = server.json(f"/api/runs/exp1/heatmap?kind={kind}&stat={fmt}_lost")
    assert answer["stat"] == f"{fmt}_lost"
    assert not answer["log_scale"]  # zero, nothing lost, is a value to see
    rows = lost_rows(layerscope.load(runs_root / "exp1"), kind, answer["tensor"], fmt)
    values = unpack(answer["values"])
    for row, layer in enumerate(answer["layers"]):
        expected = rows[rows["module"] == layer].sort_values("step")["lost"].to_numpy(np.float64)
        np.testing.assert_allclose(values[row], expected, rtol=1e-6)
    if fmt == "e4m3" and kind == "grad":
        assert np.nanmax(values) > 0  # the tiny MLP's gradients flush in fp8


def test_downsampled_columns_show_the_worst_step(server, runs_root):
    answer = server.json("/api/runs/exp1/heatmap?kind=grad&stat=e4m3_lost&columns=4")
    assert answer["downsampled"]
    assert answer["aggregate"] == "max"
    rows = lost_rows(layerscope.load(runs_root / "exp1"), "grad", "out", "e4m3")
    expected = rows.assign(bucket=rows["step"] // 2).groupby(["module", "bucket"])["lost"].max()
    values = unpack(answer["values"])
    for row, layer in enumerate(answer["layers"]):
        np.testing.assert_allclose(values[row], expected.loc[layer].to_numpy(), rtol=1e-6)


def test_a_layers_series_holds_the_fraction_lost(server, runs_root):
    answer = server.json("/api/runs/exp1/series?kind=grad&module=1")
    rows = lost_rows(layerscope.load(runs_root / "exp1"), "grad", "out", "e5m2")
    rows = rows[rows["module"] == "1"].sort_values("step")
    np.testing.assert_allclose(
        unpack(answer["stats"]["e5m2_lost"]), rows["lost"].to_numpy(np.float64), rtol=1e-6
    )


def test_an_unknown_format_is_400_naming_stat(server):
    status, _, body = server.get("/api/runs/exp1/heatmap?kind=grad&stat=e3m4_lost")
    assert status == 400
    assert "stat" in json.loads(body)["error"]
