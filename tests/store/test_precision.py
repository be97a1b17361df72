"""``layerscope.precision``: each format's losses per recorded tensor, read back from a run.

Expected counts come from the recorded tensors themselves, in numpy float64, with the formats'
limits written out (tests/stats/stats_reference.py), never from layerscope's kernels.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from tests.stats.stats_reference import FORMAT_LIMITS, brute_force_scale, headroom_reference

import layerscope

pytest.importorskip("pandas")

FORMATS = ("e4m3", "e5m2", "fp16", "bf16")


def _batches() -> list[torch.Tensor]:
    """Per step: magnitudes from 1e-45 to 1e38 and back, so that every format loses some."""
    generator = torch.Generator().manual_seed(0)
    batches = []
    for step in range(3):
        exponent = torch.randint(-45, 38, (6, 32), generator=generator).double()
        x = torch.randn(6, 32, generator=generator, dtype=torch.float64) * 10.0**exponent
        x[0, :4] = torch.tensor([448.0, 449.0, 2.0**-9, 2.0**-10]) * (step + 1)
        batches.append(x.float())
    return batches


def _record(run=None, **kwargs):
    """A ReLU watched every step: its activation is relu(batch), its grad all ones."""
    model = torch.nn.Sequential(torch.nn.ReLU())
    batches = _batches()
    with layerscope.watch(model, every=1, run=run, **kwargs) as scope:
        for batch in batches:
            # Two calls of the step, merged into one reading per step.
            for half in batch.chunk(2):
                model(half.requires_grad_()).sum().backward()
            scope.step()
    return scope, batches


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    path = tmp_path_factory.mktemp("precision") / "run"
    scope, batches = _record(run=path)
    return path, scope, batches


@pytest.mark.parametrize("fmt", FORMATS)
def test_counts_fractions_and_scales_match_the_recorded_values(recorded, fmt):
    path, _, batches = recorded
    frame = layerscope.precision(path, fmt)
    assert list(frame.columns) == list(layerscope.store.PRECISION_COLUMNS)
    activations = frame[frame.kind == "activation"].set_index("step")
    assert sorted(activations.index) == [0, 1, 2]
    largest = FORMAT_LIMITS[fmt.upper()][0]
    for step, batch in enumerate(batches):
        values = torch.relu(batch).double().numpy().reshape(-1)
        want = headroom_reference(values)
        row = activations.loc[step]
        over, under = want[f"{fmt.upper()}_OVER"], want[f"{fmt.upper()}_UNDER"]
        assert (row.numel, row.overflow, row.underflow) == (values.size, over, under)
        assert row.overflow_frac == over / values.size
        assert row.underflow_frac == under / values.size
        assert row.lost_frac == (over + under) / values.size
        assert row.scale_exp == brute_force_scale(float(np.abs(values).max()), largest)
    if fmt == "e4m3":
        assert (activations.overflow > 0).all()
        assert (activations.underflow > 0).all()


def test_a_run_its_path_and_its_scope_give_the_same_frame(recorded):
    path, scope, _ = recorded
    from_path = layerscope.precision(str(path), "e5m2")
    from_run = layerscope.precision(layerscope.load(path), "e5m2")
    from_scope = layerscope.precision(scope, "e5m2")
    assert from_path.equals(from_run)
    assert from_path.drop(columns="dtype").equals(from_scope.drop(columns="dtype"))


def test_a_scope_in_memory_is_read_too():
    scope, batches = _record()
    frame = layerscope.precision(scope, "fp16")
    grads = frame[frame.kind == "grad"]
    assert (grads.overflow == 0).all()
    assert (grads.underflow == 0).all()
    assert (grads.scale_exp == 15).all()  # 2**15 <= 65504 < 2**16
    assert len(frame[frame.kind == "activation"]) == len(batches)


def test_the_sentinels_rows_and_integer_tensors_are_left_out(tmp_path):
    class Counts(torch.nn.Module):
        def forward(self, x):
            return x * 1000.0, (x > 0).long()

    model = torch.nn.Sequential(Counts())
    schedule = layerscope.Schedule(every=2, sentinel=True)
    with layerscope.watch(model, every=schedule, run=tmp_path / "run") as scope:
        for _ in range(4):
            model(torch.randn(8, 4))
            scope.step()
    stats = layerscope.load(tmp_path / "run").stats
    assert stats.sentinel.any()
    assert (stats.dtype == "int64").any()
    frame = layerscope.precision(tmp_path / "run", "e4m3")
    assert set(frame.step) == {0, 2}
    assert set(frame.tensor) == {"out.0"}
    assert (frame.dtype == "float32").all()


def test_a_bad_format_is_refused_with_the_choices(recorded):
    with pytest.raises(ValueError, match="fmt: expected one of 'e4m3', 'e5m2', 'fp16', 'bf16'"):
        layerscope.precision(recorded[0], "fp8")


def test_a_bad_run_is_refused():
    with pytest.raises(TypeError, match="run: expected a Run, a Scope or the path of a run"):
        layerscope.precision(42, "e4m3")


def test_a_run_recorded_without_the_counts_says_so(tmp_path):
    _record(run=tmp_path / "run", stats=["mean", "absmax"])
    with pytest.raises(ValueError, match=r"no fp8 e4m3 counts .*stats="):
        layerscope.precision(tmp_path / "run", "e4m3")


@pytest.mark.parametrize("stored", [True, False], ids=["stored", "in-memory"])
def test_a_run_with_no_statistics_yet_has_no_rows(tmp_path, stored):
    path = tmp_path / "run" if stored else None
    with layerscope.watch(torch.nn.Sequential(torch.nn.ReLU()), every=1, run=path) as scope:
        pass  # closed before any step was recorded
    for fmt in FORMATS:
        frame = layerscope.precision(path if stored else scope, fmt)
        assert frame.empty
        assert list(frame.columns) == list(layerscope.store.PRECISION_COLUMNS)


def test_the_counts_are_int64_columns_in_the_store(recorded):
    run = layerscope.load(recorded[0])
    types = run.sql("select * from stats limit 0").dtypes
    for fmt in FORMATS:
        assert types[f"{fmt}_over"] == "int64"
        assert types[f"{fmt}_under"] == "int64"
        assert types[f"{fmt}_scale_exp"] == "float64"


def test_reading_the_counts_imports_no_torch(recorded):
    code = (
        "import json, sys, layerscope\n"
        f"frame = layerscope.precision({str(recorded[0])!r}, 'bf16')\n"
        "assert len(frame) > 0\n"
        "print(json.dumps('torch' in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) is False


def test_nan_and_inf_are_not_lost_values(tmp_path):
    model = torch.nn.Sequential(torch.nn.Identity())
    with layerscope.watch(model, every=1, run=tmp_path / "run", kinds=("activation",)) as scope:
        model(torch.tensor([math.nan, math.inf, -math.inf, 1e6, 1e-12]))
        scope.step()
    row = layerscope.precision(tmp_path / "run", "fp16").iloc[0]
    assert (row.numel, row.overflow, row.underflow) == (5, 1, 1)
