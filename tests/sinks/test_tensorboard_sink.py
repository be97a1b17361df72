import math

import pytest
import torch
from signed_values import NON_FINITE, SIGNED_VALUES, Emit, signed_bins
from torch import nn

import layerscope

pytest.importorskip("tensorboard")


def test_event_file_holds_scalars_statistics_and_histograms(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
    sink = layerscope.sinks.TensorBoard(tmp_path)
    with layerscope.watch(model, every=1, sinks=[sink]) as scope:
        for step in range(3):
            model(torch.randn(5, 4)).sum().backward()
            scope.step(loss=float(step) / 2)
    frame = scope.frame()

    events = EventAccumulator(str(tmp_path), size_guidance={"histograms": 0, "scalars": 0})
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(0, 0.0), (1, 0.5), (2, 1.0)]
    tags = set(events.Tags()["scalars"])
    for module, kind, tensor in frame[["module", "kind", "tensor"]].itertuples(index=False):
        assert f"train/{kind}/{module}/{tensor}/mean" in tags
    weight = frame.query("module == '0' and kind == 'weight' and tensor == 'weight'")
    logged = events.Scalars("train/weight/0/weight/std")
    assert [e.value for e in logged] == pytest.approx(weight["std"].tolist(), rel=1e-6)

    histogram = events.Histograms("train/activation/1/out")[-1].histogram_value
    row = frame.query("module == '1' and kind == 'activation' and step == 2").iloc[0]
    assert histogram.num == row["numel"] == 40
    nonzero = [int(c) for c in row["hist"] if c]
    assert [int(c) for c in histogram.bucket if c] == nonzero
    assert math.isclose(histogram.max, row["absmax"], rel_tol=1e-6)


class _Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(self.lin(x))


def test_a_module_called_twice_a_step_gets_a_tag_per_call(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = _Twice()
    sink = layerscope.sinks.TensorBoard(tmp_path, stats="absmax")  # one name, not its letters
    watch = layerscope.watch(model, every=1, sinks=[sink], kinds=("activation",))
    with watch as scope:
        for _ in range(2):
            model(torch.randn(3, 4)).sum().backward()
            scope.step()
    frame = scope.frame().query("module == 'lin'")
    events = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    events.Reload()
    assert {"train/activation/lin/out/absmax", "train/activation/lin/out#1/absmax"} <= set(
        events.Tags()["scalars"]
    )
    for call, tensor in ((0, "out"), (1, "out#1")):
        logged = events.Scalars(f"train/activation/lin/{tensor}/absmax")
        rows = frame[frame.call == call].sort_values("step")
        assert [e.step for e in logged] == rows.step.tolist() == [0, 1]
        assert [e.value for e in logged] == pytest.approx(rows.absmax.tolist(), rel=1e-6)


def test_tensorboard_needs_its_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tensorboard", None)
    with pytest.raises(ImportError, match=r"layerscope\[tensorboard\]"):
        layerscope.watch(nn.Linear(2, 2), sinks=[layerscope.sinks.TensorBoard("unused")])


def test_each_attention_head_is_a_chart_of_its_entropy(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
    sink = layerscope.sinks.TensorBoard(tmp_path)
    with layerscope.watch(model, every=1, sinks=[sink], attention=True) as scope:
        for _ in range(2):
            model(torch.randn(3, 5, 8)).sum().backward()
            scope.step()
    frame = scope.frame("attention")
    events = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    events.Reload()
    for head in (0, 1):
        rows = frame[frame["head"] == head].sort_values("step")
        for column in ("entropy_mean", "entropy_frac"):
            logged = events.Scalars(f"train/attention/self_attn/head{head}/{column}")
            assert [e.step for e in logged] == rows.step.tolist() == [0, 1]
            assert [e.value for e in logged] == pytest.approx(rows[column].tolist(), rel=1e-6)


def test_histograms_are_drawn_over_signed_values_and_replayed_as_magnitudes(tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from layerscope.cli import main

    model = nn.Sequential(Emit())
    sink = layerscope.sinks.TensorBoard(tmp_path / "tb")
    watch = layerscope.watch(
        model, every=1, run=tmp_path / "run", sinks=[sink], kinds=("activation",), alerts=False
    )
    with watch as scope:
        model(torch.tensor(SIGNED_VALUES + NON_FINITE))
        scope.step()

    def written(folder):
        events = EventAccumulator(str(folder), size_guidance={"histograms": 0})
        events.Reload()
        return events.Histograms("train/activation/0/out")[-1].histogram_value

    histogram = written(tmp_path / "tb")
    # TensorBoard draws bucket i from limit i-1 (min for the first) to limit i.
    lefts = [histogram.min, *histogram.bucket_limit[:-1]]
    occupied = [
        (left, right, count)
        for left, right, count in zip(lefts, histogram.bucket_limit, histogram.bucket, strict=True)
        if count
    ]
    want = signed_bins(SIGNED_VALUES)
    assert {right: count for _, right, count in occupied} == {up: n for (_, up), n in want.items()}
    assert [left for left, _, _ in occupied[1:]] == sorted(low for low, _ in want)[1:]
    assert sum(count for _, right, count in occupied if right < 0) == 5  # the negative values
    assert (histogram.min, histogram.max) == (-8895.0, 3.0)
    assert histogram.num == len(SIGNED_VALUES)  # Inf and NaN are inf_count and nan_count

    # The run keeps magnitudes; replayed from it, the histogram is of |x| again.
    assert main(["export", str(tmp_path / "run"), "--tensorboard", str(tmp_path / "again")]) == 0
    capsys.readouterr()
    replayed = written(tmp_path / "again")
    assert replayed.min == 0.0
    assert all(limit > 0 for limit in replayed.bucket_limit)
    (stored,) = layerscope.load(tmp_path / "run").stats.query("module == '0'")["hist"]
    assert [int(c) for c in replayed.bucket if c] == [int(c) for c in stored if c]
