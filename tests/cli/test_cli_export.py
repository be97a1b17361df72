"""``layerscope export RUN``: a recorded run replayed into TensorBoard, MLflow and W&B."""

import json
import math
import struct
import time
from pathlib import Path

import pytest
import torch
from cli_runs import tiny_model, train
from torch import nn

import layerscope
from layerscope.cli import _replay

pytest.importorskip("tensorboard")

STATS = ("mean", "std", "absmax", "l2", "zero_frac", "nan_count")


def _events(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"histograms": 0, "scalars": 0})
    events.Reload()
    return events


def _logged(events, tag):
    """(steps, values) of a scalar tag, in step order."""
    found = sorted((event.step, event.value) for event in events.Scalars(tag))
    return [step for step, _ in found], [value for _, value in found]


def _check_tensorboard(folder, run):
    """Every statistic, histogram and scalar of ``run`` is in the event files under ``folder``."""
    events = _events(folder)
    stats, scalars = run.stats, run.scalars
    for (module, kind, tensor), group in stats.groupby(["module", "kind", "tensor"]):
        for stat in STATS:
            # A sentinel row has a few statistics; NaN is a statistic of no values: neither shows.
            kept = group[group[stat].notna()].sort_values("step")
            steps, values = _logged(events, f"train/{kind}/{module}/{tensor}/{stat}")
            assert steps == kept.step.tolist()
            assert values == pytest.approx(kept[stat].tolist(), rel=1e-6, abs=1e-30)  # float32
    full = stats[~stats.sentinel]
    for name, group in scalars.groupby("name"):
        steps, values = _logged(events, name)
        assert (steps, values) == (group.step.tolist(), pytest.approx(group.value.tolist()))
    for record in full.to_dict("records"):
        tag = f"train/{record['kind']}/{record['module']}/{record['tensor']}"
        (histogram,) = [h for h in events.Histograms(tag) if h.step == record["step"]]
        nonzero = [int(count) for count in record["hist"] if count]
        assert [int(count) for count in histogram.histogram_value.bucket if count] == nonzero
    return events


@pytest.fixture
def exported(tmp_path, cli):
    """``export --tensorboard`` of a 3-step run: (status, stdout, stderr, run, folder)."""
    path = train(tiny_model(), tmp_path / "runs" / "exp1")
    folder = tmp_path / "tb"
    return (*cli("export", path, "--tensorboard", folder), layerscope.load(path), folder)


def test_tensorboard_export_holds_the_runs_statistics_scalars_and_histograms(exported):
    status, out, err, run, folder = exported
    assert (status, err) == (0, "")
    path = run.path
    assert out == (
        f"exported {path} (rank 0, steps 0 to 2): 42 rows of statistics, 3 scalars, 0 alerts "
        f"to TensorBoard {folder}\n"
    )
    _check_tensorboard(folder, run)


def test_a_run_is_read_in_chunks_of_steps_with_the_same_result(tmp_path, cli, monkeypatch):
    path = train(tiny_model(), tmp_path / "runs" / "exp1", steps=5)
    run = layerscope.load(path)
    monkeypatch.setattr(_replay, "CHUNK_ROWS", 20)  # 14 rows a step: a chunk of 2 steps
    assert _replay.step_ranges(run, 0) == [(None, 1), (1, 3), (3, None)]
    seen = [len(records.stats) for records in _replay.replay(run)]
    assert seen == [28, 28, 14]
    assert cli("export", path, "--tensorboard", tmp_path / "tb")[0] == 0
    _check_tensorboard(tmp_path / "tb", run)


def test_sentinel_rows_are_exported_as_the_statistics_they_have(tmp_path, cli):
    every = layerscope.Schedule(every=3, sentinel=True)
    path = _train(tmp_path / "runs" / "sparse", steps=4, every=every, alerts=False)
    run = layerscope.load(path)
    sentinel = run.stats[run.stats.sentinel]
    assert len(sentinel) > 0  # steps 1 and 2 kept the sentinel's statistics only
    assert cli("export", path, "--tensorboard", tmp_path / "tb")[0] == 0
    events = _check_tensorboard(tmp_path / "tb", run)
    module, kind, tensor = sentinel.iloc[0][["module", "kind", "tensor"]]
    rows = run.stats.query("module == @module and kind == @kind and tensor == @tensor")
    steps, values = _logged(events, f"train/{kind}/{module}/{tensor}/absmax")
    assert steps == sorted(rows.step.tolist())
    assert values == pytest.approx(rows.sort_values("step").absmax.tolist(), rel=1e-6)


def test_mlflow_export_holds_the_runs_statistics_and_alerts(tmp_path, cli, capsys, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    path = _train(tmp_path / "runs" / "nan", nan_at=2)
    capsys.readouterr()  # the alert's line, from training
    run = layerscope.load(path)
    assert len(run.alerts) >= 1
    uri = (tmp_path / "mlruns").as_uri()
    status, out, err = cli(
        "export", path, "--mlflow", "--tracking-uri", uri, "--experiment", "replays"
    )
    assert (status, err) == (0, "")
    run_id = out.split("MLflow run ")[1].split()[0]
    client = MlflowClient(uri)
    recorded = client.get_run(run_id)
    assert recorded.info.run_name == "nan"
    assert recorded.info.status == "FINISHED"
    stats = run.stats[~run.stats.sentinel & run.stats["std"].notna()]  # NaN: no finite values
    for (module, kind, tensor), group in stats.groupby(["module", "kind", "tensor"]):
        metrics = client.get_metric_history(run_id, f"train/{kind}/{module}/{tensor}/std")
        metrics = sorted(metrics, key=lambda metric: metric.step)
        assert [metric.step for metric in metrics] == group.step.tolist()
        assert [metric.value for metric in metrics] == pytest.approx(group["std"].tolist())
    local = client.download_artifacts(run_id, "layerscope/alerts.json", str(tmp_path))
    written = json.loads(Path(local).read_text())
    assert [(a["step"], a["rule"], a["module"]) for a in written] == list(
        run.alerts[["step", "rule", "module"]].itertuples(index=False, name=None)
    )
    del mlflow


def _train(path, steps=4, every=1, nan_at=None, **options):
    """A small MLP trained for ``steps``; a NaN in the batch at ``nan_at`` sets off an alert."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = torch.randn(steps, 5, 4, generator=torch.Generator().manual_seed(1))
    if nan_at is not None:
        batches[nan_at, 0, 0] = math.nan
    watch = layerscope.watch(model, optimizer=optimizer, run=path, every=every, **options)
    with watch as scope:
        for batch in batches:
            loss = model(batch).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step(loss=loss)
    return path


def test_wandb_export_logs_the_runs_rows_offline(tmp_path, cli, monkeypatch, run_dir):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    wandb.teardown()  # W&B reads its settings once a process, at its setup: read these
    try:
        status, out, err = cli("export", run_dir, "--wandb", "--project", "replays")
    finally:
        wandb.teardown()
    assert (status, err) == (0, "")
    run_id = out.rstrip().rsplit(" ", 1)[1]
    (path,) = tmp_path.glob(f"**/run-{run_id}.wandb")
    rows = _wandb_history(path)
    run = layerscope.load(run_dir)
    weight = run.stats.query("module == '0' and kind == 'weight' and tensor == 'weight'")
    logged = [
        (r["layerscope/step"], r["train/weight/0/weight/std"])
        for r in rows
        if "train/weight/0/weight/std" in r
    ]
    assert [step for step, _ in logged] == weight.step.tolist()
    assert [value for _, value in logged] == pytest.approx(weight["std"].tolist(), rel=1e-12)
    assert [r["loss"] for r in rows if "loss" in r] == pytest.approx(run.scalars.value.tolist())


def _wandb_history(path):
    """History rows of a finished ``.wandb`` file (a LevelDB log of protobuf records)."""
    from wandb.proto import wandb_internal_pb2

    deadline = time.monotonic() + 20
    while True:  # finish() returns before the service has written the last blocks
        data = Path(path).read_bytes()
        records, position, pending = [], 7, b""
        while position + 7 <= len(data):
            left = 32768 - position % 32768
            _, length, kind = struct.unpack("<IHB", data[position : position + 7])
            if left < 7 or (kind == 0 and length == 0):
                position += left
                continue
            payload = data[position + 7 : position + 7 + length]
            position += 7 + length
            if kind in (2, 3):  # first and middle pieces of a record
                pending += payload
                continue
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending + payload)
            records.append(record)
            pending = b""
        kinds = [record.WhichOneof("record_type") for record in records]
        if "exit" in kinds or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return [
        {
            "/".join(item.nested_key) or item.key: json.loads(item.value_json)
            for item in record.history.item
        }
        for record in records
        if record.WhichOneof("record_type") == "history"
    ]


def test_options_of_another_destination_are_refused(cli, run_dir, tmp_path):
    status, out, err = cli("export", run_dir, "--tensorboard", tmp_path / "tb", "--project", "p")
    assert (status, out) == (2, "")
    assert err == "layerscope export: --project goes with --wandb\n"
    status, _, err = cli("export", run_dir, "--wandb", "--experiment", "e")
    assert status == 2
    assert "--experiment go with --mlflow" in err
    assert not (tmp_path / "tb").exists()


def test_a_destination_is_required_and_a_missing_run_is_one_line(cli, tmp_path):
    status, _, err = cli("export", tmp_path / "nothing")
    assert status == 2
    assert "one of the arguments --tensorboard --wandb --mlflow is required" in err
    status, out, err = cli("export", tmp_path / "nothing", "--tensorboard", tmp_path / "tb")
    assert (status, out) == (2, "")
    assert err.count("\n") == 1
    assert "no run at" in err


def test_stats_chooses_the_statistics_sent(cli, run_dir, tmp_path):
    status, _, err = cli("export", run_dir, "--tensorboard", tmp_path / "tb", "--stats", "max,l2")
    assert (status, err) == (0, "")
    tags = set(_events(tmp_path / "tb").Tags()["scalars"])
    assert {tag.rsplit("/", 1)[1] for tag in tags if tag.count("/") == 4} == {"max", "l2"}
    assert "loss" in tags


def test_a_tracker_that_fails_is_one_line(cli, run_dir, tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)  # MLflow 3 refuses the store
    uri = (tmp_path / "mlruns").as_uri()
    status, out, err = cli("export", run_dir, "--mlflow", "--tracking-uri", uri)
    assert (status, out) == (2, "")
    assert err.startswith("layerscope export: MLflow: MlflowException: ")
    assert "MLFLOW_ALLOW_FILE_STORE" in err
    assert err.count("\n") == 1


def test_attention_rows_are_exported_as_each_heads_charts(tmp_path, cli):
    model = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
    path = tmp_path / "runs" / "attn"
    with layerscope.watch(model, every=1, run=path, attention=True, alerts=False) as scope:
        for _ in range(3):
            model(torch.randn(3, 5, 8)).sum().backward()
            scope.step()
    run = layerscope.load(path)
    assert len(run.attention) == 3 * 2
    assert cli("export", path, "--tensorboard", tmp_path / "tb")[0] == 0
    events = _events(tmp_path / "tb")
    for head, rows in run.attention.groupby("head"):
        for column in ("entropy_mean", "entropy_frac"):
            steps, values = _logged(events, f"train/attention/self_attn/head{head}/{column}")
            assert steps == rows.step.tolist() == [0, 1, 2]
            assert values == pytest.approx(rows[column].tolist(), rel=1e-6)
