"""The on_tensor worker pool: values by value, a bounded queue, failures, and shutdown.

Workers are started by spawn, as in real use, so each imports torch and this module (the
callbacks below are module-level for that) before it takes records: seconds per worker. Tests
of what does not depend on how a worker starts (a callback that fails, turning off, giving up
on a worker) fork instead: they start several workers each, and a forked one starts at once.
"""

from __future__ import annotations

import ctypes
import faulthandler
import functools
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable
from multiprocessing import resource_tracker
from pathlib import Path

import pytest
import torch

from layerscope import LayerscopeWarning
from layerscope.tensors import Record
from layerscope.tensors._records import is_compact
from layerscope.tensors._workers import FAILURES_TO_TURN_OFF, TensorWorkers, check_on_tensor

SCRIPT = Path(__file__).with_name("workers_script.py")
STARTUP_S = 120  # a generous bound for spawned workers to import torch on a loaded machine
# Python 3.12+ warns that forking a process with threads may deadlock; these children only
# run the callback below, which touches no lock another thread may hold.
FORK = pytest.mark.filterwarnings(
    "ignore:.*use of fork\\(\\) may lead to deadlocks:DeprecationWarning"
)


# Callbacks: they run in the workers, which import them from this module.


def save_record(record: Record, directory: Path | None) -> None:
    assert directory is not None
    torch.save(
        {
            "value": record.value,
            "metadata": record.metadata(),
            "compact": is_compact(record.value),
            "pid": os.getpid(),
            "directory": str(directory),
        },
        directory / f"{record.step}.pt",
    )


def note_after_sleep(record: Record, directory: Path | None, *, out: Path, seconds: float) -> None:
    time.sleep(seconds)
    (out / f"{record.step}.txt").write_text(f"{directory!r} {os.getpid()}")


def fail_on_some_steps(record: Record, directory: Path | None, *, out: Path) -> None:
    if record.step == 2:
        raise ValueError("step 2 is bad")
    if record.step == 4:
        os._exit(1)
    (out / f"{record.step}.txt").write_text(str(os.getpid()))


def segfault(record: Record, directory: Path | None) -> None:
    faulthandler.disable()  # pytest's, inherited by a forked worker: no dump on stderr
    ctypes.string_at(0)  # reads address 0: SIGSEGV


def hang_ignoring_sigterm(record: Record, directory: Path | None, *, out: Path) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    (out / "started").touch()
    time.sleep(600)


# Helpers.


class TerminatedInAWeakrefCallback:
    """Sends its worker SIGTERM from inside a weakref callback, where Python only prints what
    the signal's handler raises; notes its close() in ``out``."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def __call__(self, record: Record, directory: Path | None) -> None:
        def collected(_: object) -> None:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(100_000):  # the handler runs here, inside the callback
                pass

        class Dropped:
            pass

        dropped = Dropped()
        reference = weakref.ref(dropped, collected)
        del dropped
        (self.out / "called").write_text(str(reference() is None))

    def close(self) -> None:
        (self.out / "closed").write_text("closed")


def _record(step: int, value: torch.Tensor, kind: str = "activation") -> Record:
    return Record(
        module="block.0", type="Linear", kind=kind, tensor="out", step=step, phase="eval",
        call=1, value=value, count=2,
    )  # fmt: skip


def _wait_for(condition: Callable[[], bool], timeout: float = STARTUP_S) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _submit_each(pool: TensorWorkers, records: list[Record]) -> None:
    """Submit every record, trying again while the queue is full."""
    for record in records:
        assert _wait_for(lambda record=record: pool.submit(record)), "the queue stayed full"


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs: a zombie left for a parent that does not reap it counts as gone."""
    if not Path("/proc/self").is_dir():  # macOS: ask the kernel, zombies included
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd")) if Path("/proc/self/fd").is_dir() else set()


def _monitor_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "layerscope-on_tensor" and t.is_alive()]


def _bits(value: torch.Tensor) -> torch.Tensor:
    """The value's bits where it is floating point: -0.0 and NaN compare exactly."""
    if not value.dtype.is_floating_point:
        return value
    return value.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[value.element_size()])


# The pool.


def test_values_arrive_exactly_with_their_metadata(tmp_path):
    directory = tmp_path / "run" / "rank0"  # not there: the worker makes it
    values = [
        torch.tensor([1.5, -0.0, float("inf"), float("nan"), -3.25e-5]),
        torch.randn(3, 5).bfloat16(),
        torch.arange(-3, 9).reshape(3, 4),  # int64
        torch.randn(4, 6)[:, ::2].t(),  # a non-contiguous view of a larger storage
        torch.tensor(2.5, dtype=torch.float64),
        torch.zeros(0, 3),
        torch.tensor([True, False, True]),
    ]
    kinds = ("grad", "input")
    records = [_record(step, value, kinds[step % 2]) for step, value in enumerate(values)]
    resource_tracker.ensure_running()  # spawn starts it once per process, and keeps its pipe
    fds = _open_fds()
    pool = TensorWorkers(save_record, 1, directory)
    pids = pool.pids()
    _submit_each(pool, records)
    assert pool.close(timeout=STARTUP_S)
    assert _open_fds() == fds  # its pipes are closed, and no shared memory was opened
    assert (pool.processed, pool.errors, pool.restarts) == (len(records), 0, 0)
    for record in records:
        saved = torch.load(directory / f"{record.step}.pt", weights_only=True)
        value = saved["value"]
        assert value.dtype == record.value.dtype
        assert value.shape == record.value.shape
        assert torch.equal(_bits(value), _bits(record.value.contiguous()))
        assert saved["compact"]  # the worker's copy holds its elements only
        assert saved["metadata"] == record.metadata()
        assert saved["directory"] == str(directory)
        assert saved["pid"] in pids
    assert os.getpid() not in pids
    assert pool.pids() == []
    assert not any(_alive(pid) for pid in pids)
    assert not _monitor_threads()
    assert pool.close() is True  # idempotent


def test_a_full_queue_drops_and_submit_never_waits(tmp_path):
    callback = functools.partial(note_after_sleep, out=tmp_path, seconds=0.5)
    pool = TensorWorkers(callback, 1, None)
    (pid,) = pool.pids()
    os.kill(pid, signal.SIGINT)  # while it starts: Ctrl-C is for the training process
    _submit_each(pool, [_record(-1, torch.ones(1))])
    assert _wait_for(lambda: pool.processed == 1)
    os.kill(pid, signal.SIGINT)  # and once it runs
    start = time.perf_counter()
    accepted = [pool.submit(_record(step, torch.randn(64, 64))) for step in range(40)]
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0  # a worker would need 40 * 0.5 s for them all
    assert pool.dropped == accepted.count(False) > 0
    assert pool.submitted + pool.dropped == 41
    # The queue (2 * workers) and the worker's record, and what it finished meanwhile.
    assert accepted.count(True) <= 3 + int(elapsed / 0.5)
    assert pool.close(timeout=60)
    assert (pool.processed, pool.errors, pool.restarts) == (pool.submitted, 0, 0)
    kept = sorted(int(path.stem) for path in tmp_path.glob("*.txt"))
    assert kept == [-1] + [step for step in range(40) if accepted[step]]
    assert {path.read_text() for path in tmp_path.glob("*.txt")} == {f"None {pid}"}
    assert not _alive(pid)


def test_queue_bytes_bounds_what_waits_and_one_big_record_still_fits(tmp_path):
    callback = functools.partial(note_after_sleep, out=tmp_path, seconds=0.5)
    pool = TensorWorkers(callback, 1, None, queue_size=100, queue_bytes=1000)
    try:
        # The worker is still starting (spawn imports torch): nothing leaves the queue.
        big = pool.submit(_record(0, torch.ones(2000)))  # 8,000 bytes into an empty queue
        assert big
        assert not pool.submit(_record(1, torch.ones(10)))  # 40 more bytes: over 1,000
        assert (pool.submitted, pool.dropped) == (1, 1)
    finally:
        pool.close(timeout=30)
    assert pool.processed == 1


def test_a_worker_killed_while_idle_is_replaced_and_the_others_go_on(tmp_path):
    # A shared multiprocessing.Queue would stall here: the killed worker held its read lock.
    callback = functools.partial(note_after_sleep, out=tmp_path, seconds=0.05)
    pool = TensorWorkers(callback, 2, None)
    first, second = pool.pids()

    def writers(steps: range) -> set[int]:
        return {int((tmp_path / f"{step}.txt").read_text().split()[1]) for step in steps}

    step, deadline = 0, time.monotonic() + STARTUP_S
    while writers(range(step)) != {first, second}:  # both took records: both are running
        assert time.monotonic() < deadline
        _submit_each(pool, [_record(step, torch.ones(2)), _record(step + 1, torch.ones(2))])
        step += 2
        assert _wait_for(lambda step=step: pool.processed == step)
    os.kill(first, signal.SIGKILL)  # as the OOM killer would
    assert _wait_for(lambda: pool.restarts == 1)
    _submit_each(pool, [_record(later, torch.ones(2)) for later in range(step, step + 8)])
    with pytest.warns(LayerscopeWarning) as caught:
        clean = pool.close(timeout=STARTUP_S)
    assert clean
    (message,) = [str(warning.message) for warning in caught]
    assert "ended with signal SIGKILL while it waited for records" in message
    assert (pool.processed, pool.errors, pool.restarts) == (step + 8, 0, 1)
    assert first not in writers(range(step, step + 8))


@FORK
def test_a_failed_worker_is_replaced_and_the_first_failure_warned_once(tmp_path):
    callback = functools.partial(fail_on_some_steps, out=tmp_path)
    pool = TensorWorkers(callback, 1, None, start_method="fork")
    _submit_each(pool, [_record(step, torch.ones(2)) for step in range(7)])
    with pytest.warns(LayerscopeWarning) as caught:
        clean = pool.close(timeout=STARTUP_S)
    assert clean
    (message,) = [str(warning.message) for warning in caught]
    assert "fail_on_some_steps" in message
    assert "ValueError: step 2 is bad" in message
    assert "step=2" in message  # the record it failed on
    assert 'raise ValueError("step 2 is bad")' in message  # the worker's traceback
    # step 2 raised, step 4's worker exited: both counted, both workers replaced.
    assert (pool.processed, pool.errors, pool.restarts) == (5, 2, 2)
    writers = {int(path.stem): path.read_text() for path in tmp_path.glob("*.txt")}
    assert sorted(writers) == [0, 1, 3, 5, 6]
    assert writers[0] == writers[1] != writers[3] != writers[5] == writers[6] != writers[0]


@FORK
def test_three_failures_in_a_row_turn_the_pool_off():
    pool = TensorWorkers(segfault, 1, None, start_method="fork")
    pids = pool.pids()
    _submit_each(pool, [_record(step, torch.ones(2)) for step in range(FAILURES_TO_TURN_OFF)])
    assert _wait_for(lambda: pool.off)
    dropped = pool.dropped
    assert not pool.submit(_record(9, torch.ones(2)))
    assert pool.dropped == dropped + 1
    with pytest.warns(LayerscopeWarning) as caught:
        pool.warn_pending()  # on the training thread: submit never warns
    first, off = (str(warning.message) for warning in caught)
    assert "test_workers.segfault" in first
    assert "ended with signal SIGSEGV while it held Record(" in first
    assert "on_tensor test_workers.segfault is off" in off
    assert "3 times in a row" in off
    assert (pool.errors, pool.processed, pool.abandoned) == (3, 0, 0)
    assert pool.restarts >= 1
    assert pool.close(timeout=10) is False
    assert not any(_alive(pid) for pid in pids)


@FORK
def test_close_terminates_then_kills_a_worker_that_does_not_finish(tmp_path):
    callback = functools.partial(hang_ignoring_sigterm, out=tmp_path)
    pool = TensorWorkers(callback, 1, None, start_method="fork")
    (pid,) = pool.pids()
    _submit_each(pool, [_record(step, torch.ones(2)) for step in range(3)])
    assert _wait_for(lambda: (tmp_path / "started").exists())
    start = time.perf_counter()
    with pytest.warns(LayerscopeWarning, match="had not finished 3 queued tensors 0.5 s after"):
        assert pool.close(timeout=0.5) is False
    assert time.perf_counter() - start < 10
    assert (pool.processed, pool.abandoned) == (0, 3)
    assert not _alive(pid)
    assert not _monitor_threads()


@FORK
@pytest.mark.filterwarnings("ignore:layerscope. .*on_tensor")
def test_a_sigterm_whose_exception_is_swallowed_still_ends_the_worker_through_close(tmp_path):
    pool = TensorWorkers(TerminatedInAWeakrefCallback(tmp_path), 1, None, start_method="fork")
    (pid,) = pool.pids()
    try:
        pool.submit(_record(0, torch.ones(2)))
        assert _wait_for(lambda: (tmp_path / "called").exists())
        # It ends by itself, through the callback's close(), though nothing raised in its loop.
        assert _wait_for(lambda: not _alive(pid), timeout=30)
        assert (tmp_path / "closed").read_text() == "closed"
    finally:
        pool.close(timeout=1)


@pytest.mark.parametrize(
    ("on_tensor", "workers", "error", "match"),
    [
        (lambda record, directory: None, None, TypeError, "on_tensor: .*module level.*partial"),
        (None, 2, ValueError, "workers: only used with on_tensor"),
        ("save_record", None, TypeError, "on_tensor: expected a callable.*got str"),
        (save_record, 0, ValueError, "workers: expected an int >= 1, got 0"),
        (save_record, True, TypeError, "workers: expected an int >= 1, got bool"),
        (save_record, 2.0, TypeError, "workers: expected an int >= 1, got float"),
    ],
)
def test_check_on_tensor_names_the_bad_argument(on_tensor, workers, error, match):
    with pytest.raises(error, match=match):
        check_on_tensor(on_tensor, workers)


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        ({"fn": functools.partial(lambda record, directory: None)}, TypeError, "on_tensor:"),
        ({"workers": 0}, ValueError, "workers: expected an int >= 1"),
        ({"queue_size": 0}, ValueError, "queue_size: expected an int >= 1, got 0"),
        ({"start_method": "teleport"}, ValueError, "teleport"),
    ],
)
def test_a_pool_with_bad_arguments_starts_no_process(arguments, error, match):
    before = {child.pid for child in multiprocessing.active_children()}
    with pytest.raises(error, match=match):
        TensorWorkers(**{"fn": save_record, "workers": 1, "directory": None, **arguments})
    assert {child.pid for child in multiprocessing.active_children()} == before


def test_check_on_tensor_rejects_a_function_of_an_interactive_session(monkeypatch):
    def typed_in_a_notebook(record, directory):
        return None

    typed_in_a_notebook.__module__ = "__main__"
    typed_in_a_notebook.__qualname__ = "typed_in_a_notebook"
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))  # no __file__
    with pytest.raises(
        TypeError,
        match=r"on_tensor: .*__main__\.typed_in_a_notebook.* is defined in an interactive",
    ):
        check_on_tensor(functools.partial(typed_in_a_notebook), 1)


def test_check_on_tensor_rejects_a_local_function_and_takes_a_partial():
    def local(record, directory):
        return None

    with pytest.raises(TypeError, match=r"on_tensor: .*local.*define it at module level"):
        check_on_tensor(local, 1)
    callback = functools.partial(note_after_sleep, seconds=0.0, out=Path("."))
    assert check_on_tensor(callback, None) == (callback, 1)
    assert check_on_tensor(save_record, 3) == (save_record, 3)
    assert check_on_tensor(None, None) == (None, 0)


# A training process of its own: the three start together, to share the startup time.


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    launched = {}
    for name, mode in (("raise", "raise"), ("interrupt", "wait"), ("orphan", "wait")):
        out = tmp_path_factory.mktemp(name)
        with (out / "stderr").open("w") as stderr:
            process = subprocess.Popen(
                [sys.executable, str(SCRIPT), mode, str(out)],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,  # its own process group, as a terminal would make
            )
        launched[name] = (process, out)
    yield launched
    for process, _ in launched.values():
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _script_pids(out: Path) -> list[int]:
    assert _wait_for(lambda: (out / "pids.json").exists()), (out / "stderr").read_text()
    pids: list[int] = json.loads((out / "pids.json").read_text())
    assert len(pids) == 1
    assert all(_alive(pid) for pid in pids)
    return pids


def test_no_worker_outlives_an_exception_in_the_training_process(scripts):
    process, out = scripts["raise"]
    pids = _script_pids(out)
    assert process.wait(timeout=60) == 1
    assert "RuntimeError: the training script failed" in (out / "stderr").read_text()
    # Closed at interpreter exit: gone before the process ended, not because it did.
    assert json.loads((out / "survivors.json").read_text()) == []
    assert not any(_alive(pid) for pid in pids)


def test_ctrl_c_reaches_the_training_process_which_closes_the_pool(scripts):
    process, out = scripts["interrupt"]
    pids = _script_pids(out)
    os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: the whole process group gets it
    assert process.wait(timeout=60) == 0, (out / "stderr").read_text()
    closed = json.loads((out / "closed.json").read_text())
    assert closed == {"clean": True, "restarts": 0, "warnings": 0}  # the workers ignored it
    assert not any(_alive(pid) for pid in pids)


def test_workers_end_when_the_training_process_dies(scripts):
    process, out = scripts["orphan"]
    pids = _script_pids(out)
    process.kill()  # SIGKILL: no chance to close the pool
    process.wait()
    assert _wait_for(lambda: not any(_alive(pid) for pid in pids), timeout=10)
