"""examples/distributed.py runs under torchrun and writes whole-job rows from rank 0."""

from __future__ import annotations

import pytest
from tests.distributed.conftest import launch

import layerscope

pytestmark = pytest.mark.slow  # one torchrun launch


def test_example_writes_merged_rows(tmp_path):
    job = launch("../../examples/distributed.py", tmp_path / "run")
    job.assert_succeeded()
    stats = layerscope.load(tmp_path / "run").stats
    recorded = stats[~stats["sentinel"].fillna(False).astype(bool)]
    assert set(recorded["rank"]) == {0}
    relu = recorded[(recorded["module"] == "1") & (recorded["kind"] == "activation")]
    assert list(relu["step"]) == [0, 5, 10, 15]
    assert set(relu["numel"]) == {2 * 8 * 32}  # both ranks' batches of 8 x 32 features
    assert "numel" in job.output  # the table rank 0 printed
