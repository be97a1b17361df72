"""``run.plot.precision``: layers by steps of the fraction of values a format would lose.

Expected fractions come from the recorded tensors, in numpy float64, with the formats' limits
written out (tests/stats/stats_reference.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tests.stats.stats_reference import headroom_reference

import layerscope

pytest.importorskip("matplotlib")
pytest.importorskip("pandas")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A ReLU, then a clamp to +-60,000 (within fp16, beyond e5m2); values from 1e-40 to 1e8."""
    model = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Hardtanh(-6e4, 6e4))
    generator = torch.Generator().manual_seed(1)
    outputs: dict[str, list[np.ndarray]] = {"0": [], "1": []}
    path = tmp_path_factory.mktemp("plot") / "run"
    with layerscope.watch(model, every=1, run=path, kinds=("activation",)) as scope:
        for _ in range(3):
            exponent = torch.randint(-40, 8, (16, 16), generator=generator).float()
            x = torch.randn(16, 16, generator=generator) * 10.0**exponent
            first = torch.relu(x)
            outputs["0"].append(first.double().numpy().reshape(-1))
            outputs["1"].append(torch.clamp(first, -6e4, 6e4).double().numpy().reshape(-1))
            model(x)
            scope.step()
    return layerscope.load(path), outputs


def _fractions(outputs, fmt: str, which: str) -> np.ndarray:
    rows = []
    for layer in ("0", "1"):
        row = []
        for values in outputs[layer]:
            counts = headroom_reference(values)
            over, under = counts[f"{fmt.upper()}_OVER"], counts[f"{fmt.upper()}_UNDER"]
            lost = {"lost": over + under, "overflow": over, "underflow": under}[which]
            row.append(lost / values.size)
        rows.append(row)
    return np.array(rows)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "fp16", "bf16"])
@pytest.mark.parametrize("which", ["lost", "overflow", "underflow"])
def test_cells_are_the_fractions_lost(recorded, fmt, which):
    run, outputs = recorded
    fig = run.plot.precision(fmt, kind="activation", which=which)
    (image,) = fig.axes[0].images
    want = _fractions(outputs, fmt, which)
    shown = image.get_array()
    assert shown.shape == (2, 3)
    lost = want > 0
    np.testing.assert_array_equal(np.asarray(shown)[lost], want[lost])
    # Nothing lost: below the colour scale's lowest value, drawn in its grey "under" colour.
    assert (np.asarray(shown)[~lost] < image.norm.vmin).all()
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["0", "1"]
    assert fmt in fig.axes[0].get_title()


def test_the_clamp_to_60000_overflows_e5m2_only(recorded):
    run, outputs = recorded
    for fmt, clamped_overflows in (("fp16", False), ("e5m2", True)):
        want = _fractions(outputs, fmt, "overflow")
        assert (want[0] > 0).all()
        assert (want[1] > 0).all() == clamped_overflows
        image = run.plot.precision(fmt, kind="activation", which="overflow").axes[0].images[0]
        assert (np.asarray(image.get_array())[1] >= image.norm.vmin).all() == clamped_overflows


def test_bad_arguments_say_what_was_expected(recorded):
    run, _ = recorded
    with pytest.raises(ValueError, match="fmt: expected one of 'e4m3'"):
        run.plot.precision("fp8")
    with pytest.raises(ValueError, match="which: expected one of 'lost', 'overflow'"):
        run.plot.precision("e4m3", kind="activation", which="both")


def test_a_run_without_the_counts_is_refused(tmp_path):
    model = torch.nn.Sequential(torch.nn.ReLU())
    with layerscope.watch(model, every=1, run=tmp_path / "run", stats=["absmax"]) as scope:
        model(torch.randn(4))
        scope.step()
    with pytest.raises(ValueError, match="holds no fp8 e5m2 counts"):
        layerscope.load(tmp_path / "run").plot.precision("e5m2", kind="activation")
