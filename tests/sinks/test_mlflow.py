"""The MLflow sink, on a local file store: what it logs is read back with MlflowClient."""

import json
import math
import sys

import pytest
import torch
from signed_values import magnitude_counts
from torch import nn

import layerscope
from layerscope import LayerscopeWarning
from layerscope.sinks import MLflow
from layerscope.sinks._mlflow import metric_name

mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402  (after the importorskip)


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A file store of the test's own; MLflow 3 wants the file store asked for by name."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    uri = (tmp_path / "mlruns").as_uri()
    yield uri
    while mlflow.active_run() is not None:
        mlflow.end_run()


def _batches(steps, nan_at=None):
    batches = torch.randn(steps, 5, 4, generator=torch.Generator().manual_seed(1))
    if nan_at is not None:
        batches[nan_at, 0, 0] = math.nan
    return batches


def _train(sinks, steps=3, nan_at=None, model=None, **options):
    torch.manual_seed(0)
    model = model or nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
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


def history(client, run_id, key):
    metrics = sorted(client.get_metric_history(run_id, key), key=lambda metric: metric.step)
    return [metric.step for metric in metrics], [metric.value for metric in metrics]


def artifact(client, run_id, path, tmp_path):
    return json.loads(open(client.download_artifacts(run_id, path, str(tmp_path))).read())


def test_metric_histories_are_the_recorded_statistics_at_their_steps(store, tmp_path):
    sink = MLflow(tracking_uri=store, experiment="layerscope-tests")
    scope, _ = _train([sink], run=tmp_path / "exp1")
    frame, scalars = scope.frame(), scope.frame("scalars")
    client = MlflowClient(store)
    run = client.get_run(sink.run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "exp1"  # the layerscope run's name
    assert run.data.tags["layerscope.id"] == layerscope.load(tmp_path / "exp1").meta["id"]
    assert client.get_experiment(run.info.experiment_id).name == "layerscope-tests"

    assert history(client, sink.run_id, "loss") == (scalars.step.tolist(), scalars.value.tolist())
    for (module, kind, tensor), group in frame.groupby(["module", "kind", "tensor"]):
        for stat in ("mean", "std", "absmax", "l2", "zero_frac", "nan_count"):
            steps, values = history(client, sink.run_id, f"train/{kind}/{module}/{tensor}/{stat}")
            assert steps == group.step.tolist()
            assert values == pytest.approx(group[stat].tolist(), rel=1e-12)
    assert "train/weight/0/weight/min" not in run.data.metrics  # not among the chosen stats

    # One histograms artifact for the one flush at close: the occupied log2 bins of each sign
    # of each row, which folded onto |x| are the histogram the run stored (the frame's).
    (listed,) = client.list_artifacts(sink.run_id, "layerscope/histograms")
    assert listed.path == "layerscope/histograms/steps-00000000-00000002.json"
    entries = artifact(client, sink.run_id, listed.path, tmp_path)
    assert len(entries) == len(frame)
    by_key = {(entry["step"], entry["name"]): entry for entry in entries}
    below_zero = 0
    for record in frame.to_dict("records"):
        name = f"train/{record['kind']}/{record['module']}/{record['tensor']}/hist"
        entry = by_key[(record["step"], name)]
        counts, edges = entry["counts"], entry["edges"]
        assert magnitude_counts(counts, edges) == [int(c) for c in record["hist"] if c]
        assert len(edges) == len(counts) + 1
        assert all(math.log2(abs(edge)).is_integer() for edge in edges[1:-1])
        below_zero += sum(n for n, upper in zip(counts, edges[1:], strict=True) if upper < 0)
    assert below_zero > 0


def test_alerts_are_a_count_metric_and_an_artifact(store, tmp_path):
    sink = MLflow(tracking_uri=store)
    scope, _ = _train([sink], steps=4, nan_at=2, alerts=True)
    alerts = scope.frame("alerts")
    assert len(alerts) >= 1
    client = MlflowClient(store)
    steps, counts = history(client, sink.run_id, "layerscope/alert_count")
    assert counts[-1] == len(alerts)
    assert steps[0] == alerts.step.min() == 2
    written = artifact(client, sink.run_id, "layerscope/alerts.json", tmp_path)
    columns = ["step", "phase", "rule", "module", "kind", "tensor", "severity", "message"]
    assert [[entry[c] for c in columns] for entry in written] == alerts[columns].values.tolist()


def test_an_active_run_is_written_to_and_left_open(store):
    mlflow.set_tracking_uri(store)
    try:
        with mlflow.start_run() as active:
            mlflow.log_metric("mine", 1.0, step=0)
            sink = MLflow(tracking_uri="file:///nowhere/else", experiment="ignored")
            _train([sink], steps=2)
            assert sink.run_id == active.info.run_id
            assert mlflow.active_run().info.run_id == active.info.run_id
            client = MlflowClient(store)
            assert client.get_run(active.info.run_id).info.status == "RUNNING"
            assert history(client, active.info.run_id, "loss")[0] == [0, 1]
        assert client.get_run(active.info.run_id).info.status == "FINISHED"
        assert client.get_experiment_by_name("ignored") is None
    finally:
        mlflow.set_tracking_uri(None)


def test_a_rank_other_than_0_logs_nothing(store, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    sink = MLflow(tracking_uri=store, experiment="ranks")
    _train([sink], steps=2)
    assert sink.run_id is None
    assert MlflowClient(store).get_experiment_by_name("ranks") is None


def test_a_rank_not_known_at_start_is_asked_at_the_first_write(store, monkeypatch):
    from layerscope.distributed._ranks import ProcessRank
    from layerscope.sinks import Records, RunInfo, RunSummary

    place = ProcessRank()  # watch() before init_process_group, on what turns out rank 1
    sink = MLflow(tracking_uri=store)
    sink.start(RunInfo("id", "late", 0.0, place, {}, [], None))
    assert place.peek() is None  # starting did not fix the rank for the whole scope
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    sink.write(Records(scalars=[(0, "loss", 1.0)]))
    sink.close(RunSummary("finished", 0.0, 1, 0, 0, 0))
    assert place.peek() == (1, 2)
    run = MlflowClient(store).get_run(sink.run_id)
    assert run.info.status == "FINISHED"  # the run it started is ended, with nothing logged
    assert run.data.metrics == {}


def test_names_mlflow_refuses_are_replaced(store):
    sink = MLflow(tracking_uri=store, stats="absmax")
    _train([sink], steps=1, model=nn.Linear(4, 2), kinds=("activation",))
    names = set(MlflowClient(store).get_run(sink.run_id).data.metrics)
    assert names == {"loss", "train/activation/_root_/out/absmax"}

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(self.lin(x))

    sink = MLflow(tracking_uri=store, stats="absmax", histograms=False)
    scope, _ = _train([sink], steps=2, model=Twice(), kinds=("activation",))
    frame = scope.frame()
    client = MlflowClient(store)
    names = set(client.get_run(sink.run_id).data.metrics)
    assert {"train/activation/lin/out/absmax", "train/activation/lin/out_1/absmax"} <= names
    second = frame.query("module == 'lin' and call == 1")
    steps, values = history(client, sink.run_id, "train/activation/lin/out_1/absmax")
    assert (steps, values) == (second.step.tolist(), pytest.approx(second.absmax.tolist()))
    assert not client.list_artifacts(sink.run_id, "layerscope/histograms")
    assert metric_name("a:b#c<d> e") == "a_b_c_d_ e"


def test_a_failing_backend_warns_once_and_training_is_untouched(store, monkeypatch):
    _, unwatched = _train([], steps=3)

    def broken(self, *args, **kwargs):
        raise ConnectionError("tracking server is down")

    monkeypatch.setattr(MlflowClient, "log_batch", broken)
    sink = MLflow(tracking_uri=store)
    with pytest.warns(LayerscopeWarning, match="tracking server is down") as caught:
        scope, watched = _train([sink], steps=3)
    assert len([w for w in caught if issubclass(w.category, LayerscopeWarning)]) == 1
    assert scope.failures > 0
    for before, after in zip(unwatched.parameters(), watched.parameters(), strict=True):
        assert torch.equal(before, after)
    assert MlflowClient(store).get_run(sink.run_id).info.status == "FINISHED"


def test_mlflow_needs_its_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(ImportError, match=r"layerscope\[mlflow\]"):
        layerscope.watch(nn.Linear(2, 2), sinks=[MLflow()])


def test_each_attention_head_is_a_metric_of_its_entropy(store):
    sink = MLflow(tracking_uri=store)
    model = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
    with layerscope.watch(model, every=1, sinks=[sink], attention=True, alerts=False) as scope:
        for _ in range(2):
            model(torch.randn(3, 5, 8)).sum().backward()
            scope.step()
    frame = scope.frame("attention")
    client = MlflowClient(store)
    for head in (0, 1):
        mine = frame[frame["head"] == head].sort_values("step")
        for column in ("entropy_mean", "entropy_frac"):
            key = metric_name(f"train/attention/self_attn/head{head}/{column}")
            steps, values = history(client, sink.run_id, key)
            assert steps == mine.step.tolist() == [0, 1]
            assert values == pytest.approx(mine[column].tolist(), rel=1e-12)


def test_mlflow_3s_default_store_without_sqlalchemy_says_what_to_install(tmp_path, monkeypatch):
    import importlib.util

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "sqlalchemy" else real(name, *args),
    )
    model = nn.Linear(2, 2)
    with pytest.raises(ImportError, match=r"needs the full mlflow .*layerscope\[mlflow\]"):
        layerscope.watch(model, sinks=[MLflow(experiment="exp")])
    assert not model._forward_hooks
    assert not (tmp_path / "mlflow.db").exists()
