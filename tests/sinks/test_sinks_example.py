"""examples/sinks.py runs as a person would run it, and each tracker holds what it says."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

import layerscope

pytest.importorskip("tensorboard")
pytest.importorskip("wandb")
pytest.importorskip("mlflow")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sinks.py"


@pytest.mark.slow  # a fresh interpreter importing torch, TensorBoard, W&B and MLflow: ~9 s
def test_the_sinks_example_writes_to_all_three_trackers(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for name in ("WANDB_MODE", "WANDB_DIR", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)  # the example sets what it needs
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--out", str(tmp_path), "--steps", "12"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    run = layerscope.load(tmp_path / "run")
    assert f"run {tmp_path / 'run'}: finished, {len(run.stats)} rows of statistics" in out
    losses = run.scalars.query("name == 'loss'").sort_values("step")
    assert losses.step.tolist() == list(range(12))

    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    logged = events.Scalars("loss")
    assert [event.step for event in logged] == losses.step.tolist()
    assert [event.value for event in logged] == pytest.approx(losses.value.tolist(), rel=1e-6)

    (wandb_id,) = re.findall(r"W&B: offline run (\w+) under", out)
    assert len(list((tmp_path / "wandb").glob(f"offline-run-*-{wandb_id}/run-*.wandb"))) == 1

    (mlflow_id,) = re.findall(r"MLflow: run (\w+) in", out)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient((tmp_path / "mlruns").as_uri())
    assert client.get_run(mlflow_id).info.status == "FINISHED"
    history = sorted(client.get_metric_history(mlflow_id, "loss"), key=lambda m: m.step)
    assert [metric.step for metric in history] == losses.step.tolist()
    assert [metric.value for metric in history] == pytest.approx(losses.value.tolist())
    weights = run.stats.query("module == '0' and kind == 'weight' and tensor == 'weight'")
    std = client.get_metric_history(mlflow_id, "train/weight/0/weight/std")
    assert sorted(metric.step for metric in std) == weights.step.tolist() == [0, 5, 10]
