"""The W&B sink, offline: what it logs is read back from the run's own ``.wandb`` file."""

import json
import math
import struct
import sys
import time
from pathlib import Path

import pytest
import torch
from signed_values import NON_FINITE, SIGNED_VALUES, Emit, magnitude_counts, signed_bins
from torch import nn

import layerscope
from layerscope import LayerscopeWarning
from layerscope.distributed._ranks import ProcessRank
from layerscope.health._alert import Alert
from layerscope.sinks import Records, RunInfo, RunSummary, WandB

wandb = pytest.importorskip("wandb")


@pytest.fixture(scope="module")
def wandb_folder(tmp_path_factory):
    """W&B offline and silent, for the whole module.

    W&B reads its settings once a process, at its setup: tearing it down around the module
    makes it read these, and leaves none of them to other modules.
    """
    folder = tmp_path_factory.mktemp("wandb")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_MODE", "offline")
        patch.setenv("WANDB_DIR", str(folder))
        patch.setenv("WANDB_SILENT", "true")
        patch.setenv("WANDB_CONSOLE", "off")
        wandb.teardown()
        yield folder
        wandb.teardown()


@pytest.fixture(autouse=True)
def offline(wandb_folder, monkeypatch):
    """The folder runs go to; no rank from a launcher, and no run left active after."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    yield wandb_folder
    if wandb.run is not None:
        wandb.run.finish()


# ------------------------------------------------------------------ reading a .wandb file

_BLOCK = 32 * 1024  # the file is a LevelDB log: 32 KiB blocks of records with 7-byte headers
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _records(path):
    """The protobuf records of a finished run's ``.wandb`` file, in order.

    ``finish()`` returns before W&B's service has written the file's last blocks: wait for
    its exit record and for the file to stop growing. A read can catch a record half
    written; its tail is left for the next read.
    """
    deadline = time.monotonic() + 20
    while True:
        size = Path(path).stat().st_size
        records = list(_parse(Path(path).read_bytes()))
        kinds = [record.WhichOneof("record_type") for record in records]
        time.sleep(0.1)
        if ("exit" in kinds and Path(path).stat().st_size == size) or time.monotonic() > deadline:
            return records


def _parse(data):
    from wandb.proto import wandb_internal_pb2

    assert data[:4] == b":W&B"
    position, pending = 7, b""
    while position + 7 <= len(data):
        left = _BLOCK - position % _BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if kind == 0 and length == 0:
            position += left
            continue
        payload = data[position + 7 : position + 7 + length]
        if len(payload) < length:  # still being written
            return
        position += 7 + length
        if kind in (_FIRST, _MIDDLE):
            pending += payload
            continue
        record = wandb_internal_pb2.Record()
        record.ParseFromString(pending + payload)
        pending = b""
        yield record


def run_file(folder, run_id):
    (path,) = Path(folder).glob(f"**/run-{run_id}.wandb")
    return path


def history(folder, run_id):
    """Each logged row as {key: value}; a histogram's parts as ``{key}/values`` and so on."""
    rows = []
    for record in _records(run_file(folder, run_id)):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return rows


def record_kinds(folder, run_id):
    return [record.WhichOneof("record_type") for record in _records(run_file(folder, run_id))]


def metrics_defined(folder, run_id):
    found = {}
    for record in _records(run_file(folder, run_id)):
        if record.WhichOneof("record_type") == "metric":
            metric = record.metric
            found[metric.name or metric.glob_name] = metric.step_metric
    return found


def logged(rows, key):
    """(layerscope step, value) of every row that has ``key``."""
    return [(row["layerscope/step"], row[key]) for row in rows if key in row]


def assert_logged(rows, key, steps, values):
    """``key`` was logged at ``steps`` (the x-axis) with ``values``, JSON's float64 exactly."""
    found = logged(rows, key)
    assert [step for step, _ in found] == list(steps), key
    assert [value for _, value in found] == pytest.approx(list(values), rel=1e-12), key


# ------------------------------------------------------------------ training


def _batches(steps, nan_at=None):
    batches = torch.randn(steps, 5, 4, generator=torch.Generator().manual_seed(1))
    if nan_at is not None:
        batches[nan_at, 0, 0] = math.nan
    return batches


def _train(sinks, steps=3, nan_at=None, **options):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    options.setdefault("alerts", False)
    watch = layerscope.watch(model, optimizer=optimizer, every=1, sinks=sinks, **options)
    with watch as scope:
        for batch in _batches(steps, nan_at):
            loss = model(batch).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step(loss=loss)
    return scope, model


def test_statistics_scalars_and_histograms_reach_the_offline_run(offline):
    sink = WandB(project="layerscope-tests")
    scope, _ = _train([sink])
    frame, scalars = scope.frame(), scope.frame("scalars")
    assert wandb.run is None  # the sink's own run, finished
    assert record_kinds(offline, sink.run_id)[-1] == "exit"
    rows = history(offline, sink.run_id)

    assert_logged(rows, "loss", scalars.step, scalars.value)
    for (module, kind, tensor), group in frame.groupby(["module", "kind", "tensor"]):
        for stat in ("mean", "std", "absmax", "l2", "zero_frac", "nan_count"):
            assert_logged(rows, f"train/{kind}/{module}/{tensor}/{stat}", group.step, group[stat])

    # Histograms of the values over the occupied power-of-two bins of each sign, one per row
    # of the stats table: folded onto |x|, they are the run's log2 histogram.
    negative = 0
    for record in frame.to_dict("records"):
        key = f"train/{record['kind']}/{record['module']}/{record['tensor']}/hist"
        (row,) = [row for row in rows if row.get("layerscope/step") == record["step"]]
        assert row[f"{key}/_type"] == "histogram"
        counts, bins = row[f"{key}/values"], row[f"{key}/bins"]
        assert len(bins) == len(counts) + 1
        assert magnitude_counts(counts, bins) == [int(count) for count in record["hist"] if count]
        assert sum(counts) == record["numel"] - record["nan_count"] - record["inf_count"]
        assert all(math.log2(abs(edge)).is_integer() for edge in bins[1:-1])
        below_zero = sum(count for count, upper in zip(counts, bins[1:], strict=True) if upper < 0)
        assert below_zero == round(record["neg_frac"] * record["numel"])  # no subnormal here
        negative += below_zero
    assert negative  # weights and gradients have values below zero, drawn there

    # The training step is the x-axis of every key logged, through patterns per kind.
    defined = metrics_defined(offline, sink.run_id)
    assert defined["loss"] == defined["train/weight/*"] == "layerscope/step"
    assert set(frame.kind) == {key.split("/")[1] for key in defined if key.endswith("/*")}


def test_alerts_are_counted_as_they_come_and_tabled_at_close(offline):
    sink = WandB()
    scope, _ = _train([sink], steps=4, nan_at=2, alerts=True)
    alerts = scope.frame("alerts")
    assert len(alerts) >= 1
    rows = history(offline, sink.run_id)
    counts = logged(rows, "layerscope/alert_count")
    assert counts[-1][1] == len(alerts)
    assert counts[0][0] == alerts.step.min() == 2
    (table_row,) = [row for row in rows if "layerscope/alerts/path" in row]
    table = json.loads(
        Path(run_file(offline, sink.run_id))
        .parent.joinpath("files", table_row["layerscope/alerts/path"])
        .read_text()
    )
    assert table["columns"][:3] == ["step", "phase", "rule"]
    assert [row[:3] for row in table["data"]] == alerts[["step", "phase", "rule"]].values.tolist()


def test_an_active_run_is_written_to_and_left_open(offline):
    active = wandb.init(project="mine")
    active.log({"mine": 1.0})
    sink = WandB(project="ignored")
    _train([sink], steps=2)
    assert sink.run_id == active.id
    assert wandb.run is active  # not finished by the sink
    active.log({"mine": 2.0})
    active.finish()
    rows = history(offline, active.id)
    assert [row["mine"] for row in rows if "mine" in row] == [1.0, 2.0]
    assert [step for step, _ in logged(rows, "loss")] == [0, 1]


def test_a_rank_other_than_0_logs_nothing(offline, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    before = set(Path(offline).glob("**/*.wandb"))
    sink = WandB()
    _train([sink], steps=2)
    assert sink.run is None
    assert sink.run_id is None
    assert wandb.run is None
    assert set(Path(offline).glob("**/*.wandb")) == before


def test_a_rank_not_known_at_start_is_asked_at_the_first_write(offline, monkeypatch):
    place = ProcessRank()
    sink = WandB()
    sink.start(RunInfo("id", "late", 0.0, place, {}, [], None))
    assert place.peek() is None  # starting did not fix the rank for the whole scope
    assert sink.run is not None  # but the run is open, so that a W&B that cannot start fails
    sink.write(Records(scalars=[(0, "loss", 1.0)]))
    assert place.peek() == (0, 1)
    sink.close(RunSummary("finished", 0.0, 1, 0, 0, 0))
    assert logged(history(offline, sink.run_id), "loss") == [(0, 1.0)]

    later = ProcessRank()  # watch() before init_process_group on what turns out rank 1
    sink = WandB()
    sink.start(RunInfo("id", "late", 0.0, later, {}, [], None))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    sink.write(Records(scalars=[(0, "loss", 1.0)]))
    sink.close(RunSummary("finished", 0.0, 1, 0, 0, 0))
    assert later.peek() == (1, 2)
    assert wandb.run is None  # the run it started is finished, with nothing logged
    assert logged(history(offline, sink.run_id), "loss") == []


def test_a_failing_backend_warns_once_and_training_is_untouched(offline, monkeypatch):
    _, unwatched = _train([], steps=3)

    def broken(self, *args, **kwargs):
        raise ConnectionError("wandb is down")

    monkeypatch.setattr(wandb.sdk.wandb_run.Run, "log", broken)
    sink = WandB()
    with pytest.warns(LayerscopeWarning, match="wandb is down") as caught:
        scope, watched = _train([sink], steps=3)
    assert len([w for w in caught if issubclass(w.category, LayerscopeWarning)]) == 1
    assert scope.failures > 0
    for before, after in zip(unwatched.parameters(), watched.parameters(), strict=True):
        assert torch.equal(before, after)


def test_linear_histograms_get_finite_edges_around_their_open_ends(offline):
    sink = WandB()
    _train([sink], steps=1, histogram=("linear", -0.1, 0.1, 4), kinds=("weight",))
    rows = history(offline, sink.run_id)
    (row,) = [row for row in rows if "train/weight/0/weight/hist/bins" in row]
    bins = row["train/weight/0/weight/hist/bins"]
    assert all(math.isfinite(edge) for edge in bins)
    assert bins == sorted(bins)
    assert bins[0] < 0 < bins[-1]  # values, signed already: nothing split
    assert sum(row["train/weight/0/weight/hist/values"]) == 32


def test_values_below_zero_are_drawn_below_zero(offline):
    sink = WandB()
    model = nn.Sequential(Emit())
    watch = layerscope.watch(model, every=1, sinks=[sink], kinds=("activation",), alerts=False)
    with watch as scope:
        model(torch.tensor(SIGNED_VALUES + NON_FINITE))
        scope.step()
    key = "train/activation/0/out/hist"
    (row,) = [row for row in history(offline, sink.run_id) if f"{key}/bins" in row]
    counts, bins = row[f"{key}/values"], row[f"{key}/bins"]
    drawn = {(low, high): n for n, low, high in zip(counts, bins, bins[1:], strict=False) if n}
    assert drawn == signed_bins(SIGNED_VALUES)  # -8895 in [-16384, -8192), ..., 3 in [2, 4)
    assert len(counts) < 40  # the empty powers of two next to 0 are a bin each side


def test_wandb_needs_its_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match=r"layerscope\[wandb\]"):
        layerscope.watch(nn.Linear(2, 2), sinks=[WandB()])


def test_an_alert_record_reaches_the_table_with_every_field(offline):
    place = ProcessRank()
    place.fix()
    sink = WandB()
    sink.start(RunInfo("id", "alerts", 0.0, place, {}, [], None))
    alert = Alert(7, "train", "dead_units", "fc", "activation", "out", "warning", 0.9, 0.5, "m")
    sink.write(Records(alerts=[alert]))
    sink.close(RunSummary("failed", 0.0, 8, 0, 0, 0))
    rows = history(offline, sink.run_id)
    assert logged(rows, "layerscope/alert_count") == [(7, 1)]
    (table_row,) = [row for row in rows if "layerscope/alerts/path" in row]
    files = Path(run_file(offline, sink.run_id)).parent / "files"
    table = json.loads((files / table_row["layerscope/alerts/path"]).read_text())
    assert table["data"] == [
        [7, "train", "dead_units", "fc", "activation", "out", "warning", 0.9, 0.5, "m"]
    ]
    (ended,) = [r for r in _records(run_file(offline, sink.run_id)) if r.HasField("exit")]
    assert ended.exit.exit_code == 1  # the run failed


def test_each_attention_head_is_a_chart_of_its_entropy(offline):
    sink = WandB()
    model = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
    with layerscope.watch(model, every=1, sinks=[sink], attention=True, alerts=False) as scope:
        for _ in range(2):
            model(torch.randn(3, 5, 8)).sum().backward()
            scope.step()
    frame = scope.frame("attention")
    rows = history(offline, sink.run_id)
    for head in (0, 1):
        mine = frame[frame["head"] == head]
        for column in ("entropy_mean", "entropy_frac"):
            key = f"train/attention/self_attn/head{head}/{column}"
            assert_logged(rows, key, mine.step, mine[column])
    assert metrics_defined(offline, sink.run_id)["train/attention/*"] == "layerscope/step"
