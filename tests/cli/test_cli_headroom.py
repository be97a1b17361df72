"""``layerscope summary``'s fp8 headroom: the tensors losing most values in e4m3 and e5m2."""

import re

import pytest
from cli_runs import field, tiny_model, train

import layerscope

pytest.importorskip("duckdb")

_ENTRY = re.compile(r"(\S+) (\S+)(?: (\S+))? (\d+\.\d)% (over|flushed)$")


def _lost(run_dir, fmt):
    """Each tensor's fraction lost at the last step, from the stored counts (pandas)."""
    stats = layerscope.load(run_dir).stats
    last = stats[stats["step"] == stats["step"].max()]
    lost = (last[f"{fmt}_over"] + last[f"{fmt}_under"]) / last["numel"]
    return {
        (row.module, row.kind, row.tensor): value
        for row, value in zip(last.itertuples(), lost, strict=True)
    }


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_the_tensors_named_are_those_losing_most(run_dir, cli, fmt):
    status, out, _ = cli("summary", run_dir, "--plain")
    assert status == 0
    assert "fp8 headroom (step 2): the tensors losing most values" in out
    line = field(out, fmt)
    lost = _lost(run_dir, fmt)
    named = []
    for entry in line.split(", "):
        module, kind, tensor, percent, _ = _ENTRY.match(entry).groups()
        key = (module, kind, tensor or ("weight" if kind.startswith("weight") else "out"))
        assert lost[key] == pytest.approx(float(percent) / 100, abs=0.00051)  # to 0.1%
        named.append(key)
    assert named
    shown_least = min(lost[key] for key in named)
    assert all(value <= shown_least for key, value in lost.items() if key not in named)


def test_a_layer_that_overflows_says_over(tmp_path, cli):
    path = train(tiny_model(scale_last=1e5), tmp_path / "runs" / "big")
    _, out, _ = cli("summary", path, "--plain")
    assert re.search(r"2 activation 100\.0% over", field(out, "e4m3"))


def test_a_run_without_the_counts_has_no_headroom(tmp_path, cli):
    path = train(tiny_model(), tmp_path / "runs" / "few", stats=["mean", "absmax"])
    status, out, _ = cli("summary", path, "--plain")
    assert status == 0
    assert "fp8 headroom" not in out
