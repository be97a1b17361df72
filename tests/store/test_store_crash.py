"""A run survives its process being killed: everything flushed before the kill loads."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import layerscope

pytest.importorskip("pyarrow")

CHILD = textwrap.dedent(
    """
    import sys, time, torch, layerscope
    from layerscope.store import ParquetStore
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    store = ParquetStore(sys.argv[1], flush_steps=1, flush_seconds=0.1)
    scope = layerscope.watch(model, every=1, run=store)
    for step in range(100_000):
        model(torch.randn(2, 4)).sum().backward()
        scope.step(loss=float(step))
        scope._pipeline.drain()  # the step is on disk once this returns
        print(step, flush=True)
        time.sleep(0.01)
    """
)


def test_a_killed_run_loads_with_every_flushed_step_and_says_it_crashed(tmp_path):
    path = tmp_path / "run"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        flushed = -1
        while flushed < 5:
            line = child.stdout.readline()
            assert line, "the child exited early"
            flushed = int(line)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=30)
        child.stdout.close()
    run = layerscope.load(path)
    assert run.meta["status"] == "crashed"
    steps = sorted(set(run.stats.step))
    assert steps[: flushed + 1] == list(range(flushed + 1))
    assert set(range(flushed + 1)) <= set(run.scalars.step)
    assert run.sql("select count(*) n from stats").n.item() == len(run.stats)


KILLED_AFTER_ITS_LOSS = textwrap.dedent(
    """
    import os, signal, sys, torch, layerscope
    from layerscope.store import ParquetStore
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    store = ParquetStore(sys.argv[1], flush_steps=1, flush_seconds=0.05)
    scope = layerscope.watch(model, optimizer=optimizer, every=1, run=store)
    for step in range(6):
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        scope.step(loss=float(step))
    scope._pipeline.drain()  # what the scope has sent is on disk
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_a_killed_runs_last_recorded_step_keeps_its_loss(tmp_path):
    """With optimizer=, a step's rows go at its optimizer step and its loss just after."""
    path = tmp_path / "run"
    subprocess.run([sys.executable, "-c", KILLED_AFTER_ITS_LOSS, str(path)], timeout=120)
    run = layerscope.load(path)
    assert run.meta["status"] == "crashed"
    assert sorted(set(run.stats.step)) == list(range(6))
    assert run.scalars[run.scalars.name == "loss"].step.tolist() == list(range(6))
    # What a summary shows of it: the rows, the kernel and the cost as of the last flush.
    assert run.meta["recorded_rows"] == len(run.stats)
    assert run.meta["kernel"]
    assert run.meta["cost_seconds"] > 0


KILLED_RIGHT_AFTER_A_FLUSH = textwrap.dedent(
    """
    import json, os, signal, sys, time, torch, layerscope
    from layerscope.store import ParquetStore
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    store = ParquetStore(sys.argv[1], flush_steps=5, flush_seconds=60)
    scope = layerscope.watch(model, optimizer=optimizer, every=1, run=store)
    for step in range(12):
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        scope.step(loss=float(step))
    # The writer's second flush (its fifth recorded step is step 9) is on disk: kill now.
    waited = time.monotonic()
    while time.monotonic() - waited < 60:
        try:
            if json.load(open(sys.argv[1] + "/run.json"))["stats_last_step"] == 9:
                os.kill(os.getpid(), signal.SIGKILL)
        except (OSError, ValueError):
            pass
        time.sleep(0.01)
    sys.exit("step 9 never reached the disk")
    """
)


def test_a_run_killed_mid_training_keeps_each_flushed_steps_loss_with_its_rows(tmp_path):
    """With optimizer=, a step's rows and its loss (given after the optimizer's step) go to
    the writer together, so every flush ends both tables at the same step."""
    path = tmp_path / "run"
    child = subprocess.run(
        [sys.executable, "-c", KILLED_RIGHT_AFTER_A_FLUSH, str(path)], timeout=120
    )
    assert child.returncode == -signal.SIGKILL
    run = layerscope.load(path)
    assert run.meta["status"] == "crashed"
    assert run.meta["stats_last_step"] == run.meta["scalars_last_step"] == 9
    assert run.stats.step.max() == run.scalars.step.max() == 9
    assert sorted(run.scalars.step) == list(range(10))


def test_a_scope_left_open_is_closed_at_exit_and_its_rows_written(tmp_path):
    code = textwrap.dedent(
        """
        import sys, torch, layerscope
        from layerscope.store import ParquetStore
        model = torch.nn.Linear(3, 3)
        scope = layerscope.watch(model, every=1, run=ParquetStore(sys.argv[1], flush_steps=1000,
                                                                   flush_seconds=1000))
        for step in range(3):
            model(torch.randn(2, 3)).sum().backward()
            scope.step(loss=float(step))
        """
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "r")], check=True, timeout=120)
    run = layerscope.load(tmp_path / "r")
    assert run.meta["status"] == "finished"
    assert sorted(set(run.stats.step)) == [0, 1, 2]
    assert run.scalars.value.tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize(
    ("silent_for", "heartbeat", "expected"),
    [
        (3600.0, 5.0, "crashed"),
        (100.0, 30.0, "running"),  # 10 heartbeats of 30 s have not passed
        (400.0, 30.0, "crashed"),
        (30.0, 1.0, "running"),  # nor a minute
        (90.0, 1.0, "crashed"),
    ],
)
def test_a_run_on_another_host_whose_heartbeat_stopped_reads_as_crashed(
    tmp_path, silent_for, heartbeat, expected
):
    from layerscope.store import ParquetStore

    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(3, 3)
    with layerscope.watch(model, every=1, run=ParquetStore(tmp_path / "r", flush_seconds=2.5)):
        model(torch.randn(2, 3)).sum().backward()
    path = tmp_path / "r" / "run.json"
    meta = json.loads(path.read_text())
    assert meta["heartbeat_seconds"] == 2.5
    meta.update(
        status="running",
        host="another-host.invalid",  # its pid cannot be asked from here
        pid=1,
        updated=time.time() - silent_for,
        heartbeat_seconds=heartbeat,
    )
    path.write_text(json.dumps(meta))
    assert layerscope.load(tmp_path / "r").meta["status"] == expected
