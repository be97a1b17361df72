"""A run whose reading never ends: the server answers the other runs, that run's 503, and stops.

``hanging`` is a copy of a good run whose opening waits (as on a filesystem that stopped
answering) until the test lets it go; ``fifo``'s ``run.json`` is a named pipe no one writes.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest
from ui_runs import free_port

from layerscope.store import Run
from layerscope.ui._app import create_app
from layerscope.ui._run_threads import DEADLINE
from layerscope.ui._server import STOP_GRACE

testclient = pytest.importorskip("starlette.testclient")
pytestmark = pytest.mark.filterwarnings("ignore::layerscope.LayerscopeWarning")

# The longest any request here may take before the test fails rather than hangs.
HANG_GUARD = 20.0
CLIENTS = 50


@pytest.fixture(scope="module")
def root(tmp_path_factory, runs_root) -> Path:
    folder = tmp_path_factory.mktemp("hang") / "runs"
    for name in ("good", "hanging", "fifo"):
        shutil.copytree(runs_root / "exp2", folder / name)
    return folder


@pytest.fixture
def fifo(root):
    """``fifo/run.json`` a named pipe; afterwards every reader still waiting on it let go."""
    path = root / "fifo" / "run.json"
    saved = path.read_bytes() if path.is_file() else None
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    yield path
    let_go(path)
    path.unlink()
    if saved is not None:
        path.write_bytes(saved)


def let_go(fifo: Path, waiting=None) -> None:
    """Open ``fifo`` to write and close it until ``waiting()`` is false (None: no reader waits).

    Each reader waiting to open it opens it then, and reads its end.
    """
    deadline = time.monotonic() + HANG_GUARD
    while time.monotonic() < deadline and (waiting is None or waiting()):
        try:
            descriptor = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # no reader has it open now
            if waiting is None:
                return
        else:
            os.close(descriptor)
        time.sleep(0.005)


@pytest.fixture
def hanging(monkeypatch):
    """Opening the run ``hanging`` waits until ``release`` is set; ``entered`` counts opens."""
    release = threading.Event()
    entered = []
    opened = Run.__init__

    def waiting(self, path, *args, **kwargs):
        if Path(path).name == "hanging":
            entered.append(threading.current_thread().name)
            release.wait(HANG_GUARD * 3)
        opened(self, path, *args, **kwargs)

    monkeypatch.setattr(Run, "__init__", waiting)
    yield release, entered
    release.set()


@contextmanager
def serving(root: Path, **options):
    """The app under uvicorn on 127.0.0.1, in a thread of this process; its URL."""
    import uvicorn

    port = free_port()
    config = uvicorn.Config(
        create_app(root, **options), host="127.0.0.1", port=port, log_level="error"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + HANG_GUARD
    while not server.started:
        assert time.monotonic() < deadline, "the server did not start"
        assert thread.is_alive(), "the server stopped"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=HANG_GUARD)


def get(url: str) -> tuple[int, dict, float]:
    """(status, JSON body, when it came: monotonic seconds) of a GET."""
    try:
        with urllib.request.urlopen(url, timeout=HANG_GUARD) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, body = error.code, error.read()
    try:
        answer = json.loads(body)
    except ValueError:
        answer = {}
    return status, answer, time.monotonic()


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_healthy_run_answers_while_50_clients_wait_on_a_hanging_run(root, hanging, fifo):
    release, entered = hanging
    with serving(root, deadline=HANG_GUARD * 2) as url:
        assert get(f"{url}/api/runs/good")[0] == 200  # opened once, as the page would
        answered: dict[str, list] = {"hanging": [], "fifo": []}
        clients = [
            threading.Thread(
                target=lambda run=run: answered[run].append(get(f"{url}/api/runs/{run}")),
                daemon=True,
            )
            for run in ("hanging", "fifo")
            for _ in range(CLIENTS)
        ]
        for client in clients:
            client.start()
        wait_until(lambda: len(entered) >= 4, "the hanging run's reads did not begin")
        asked = time.monotonic()
        summary, page = get(f"{url}/api/runs/good"), get(f"{url}/")
        latency = max(summary[2], page[2]) - asked
        assert summary[0] == 200
        assert summary[1]["id"] == "good"
        assert page[0] == 200
        # Answered while every request for the hanging run still waited on its reads.
        assert answered["hanging"] == []
        print(f"healthy summary and page answered in {latency * 1e3:.0f} ms meanwhile")
        # One run never holds more than its few threads, however many ask for it.
        assert len(entered) == 4
        assert len(_reading("hanging")) == 4
        release.set()
        let_go(fifo, lambda: len(answered["fifo"]) < CLIENTS)
        for client in clients:
            client.join(timeout=HANG_GUARD)
        assert not any(client.is_alive() for client in clients)
    assert [status for status, _, _ in answered["hanging"]] == [200] * CLIENTS
    # The pipe: refused as not a run's file, or read to its end as an empty run.json.
    assert [status for status, _, _ in answered["fifo"]] == [422] * CLIENTS


def test_a_run_that_takes_too_long_is_its_own_503_and_the_list_names_it(root, hanging):
    release, _ = hanging
    app = create_app(root, deadline=0.5, per_run=2)
    with testclient.TestClient(app, base_url="http://127.0.0.1") as client:
        first = client.get("/api/runs/hanging")
        assert first.status_code == 503
        assert first.json()["run"] == "hanging"
        assert first.json()["error"].startswith("hanging: timed out: ")
        assert first.headers["retry-after"]
        # Its thread is still stuck: the next request is answered at once, without another.
        again = client.get("/api/runs/hanging/scalars")
        assert again.status_code == 503
        assert "has gone on for" in again.json()["error"]
        listed = client.get("/api/runs")
        assert listed.status_code == 200
        entries = {entry["id"]: entry for entry in listed.json()["runs"]}
        assert entries["good"]["status"] == "finished"
        assert entries["hanging"]["status"] == "unreadable"
        assert "timed out" in entries["hanging"]["error"]
        assert entries["hanging"]["steps"] is None
        assert client.get("/api/runs/good/scalars").status_code == 200
        assert len(_reading("hanging")) == 1  # the first request's: the others found it stuck
        release.set()
        wait_until(lambda: not _reading("hanging"), "the hanging run's read did not end")
        assert client.get("/api/runs/hanging").status_code == 200  # read again once let go


def _reading(run: str) -> list[threading.Thread]:
    """The threads working for ``run`` now."""
    return [thread for thread in threading.enumerate() if thread.name == f"layerscope run {run}"]


# The server of the next test: opening the run "hanging" waits forever; it says when one
# began, on stdout.
_STUCK_SERVER = """
import sys, threading
from pathlib import Path
from layerscope.store import Run
from layerscope.ui import serve
opened = Run.__init__
def waiting(self, path, *args, **kwargs):
    if Path(path).name == "hanging":
        print("waiting", flush=True)
        threading.Event().wait()
    opened(self, path, *args, **kwargs)
Run.__init__ = waiting
serve(sys.argv[1], port=0)
"""


def test_sigterm_stops_the_server_while_its_reads_hang(root):
    server = subprocess.Popen(
        [sys.executable, "-c", _STUCK_SERVER, str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    for stream in (server.stdout, server.stderr):
        threading.Thread(
            target=lambda s=stream: [lines.put(line) for line in s], daemon=True
        ).start()
    try:
        url = _served_url(lines)
        answered = []
        clients = [
            threading.Thread(target=lambda: answered.append(_status(f"{url}/api/runs/hanging")))
            for _ in range(8)
        ]
        for client in clients:
            client.start()
        assert _line(lines, "waiting"), "no read of the hanging run began"
        server.send_signal(signal.SIGTERM)
        # Before its reads' deadline: the requests waiting on them do not hold it.
        server.wait(timeout=STOP_GRACE + (DEADLINE - STOP_GRACE) / 2)
        for client in clients:
            client.join(timeout=HANG_GUARD)
        assert len(answered) == len(clients)
        assert 200 not in answered
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def _served_url(lines: queue.Queue[str]) -> str:
    """Where the server says it serves, once it answers there."""
    line = _line(lines, "serving")
    assert line, "the server did not say where it serves"
    url = line.rsplit(" at ", 1)[1].strip().rstrip("/")
    wait_until(lambda: _status(f"{url}/") == 200, "the server did not answer")
    return url


def _line(lines: queue.Queue[str], word: str) -> str | None:
    """The first line holding ``word``, within the hang guard; None if none came."""
    deadline = time.monotonic() + HANG_GUARD
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.1)
        except queue.Empty:
            continue
        if word in line:
            return line
    return None


def _status(url: str) -> int | str:
    try:
        with urllib.request.urlopen(url, timeout=HANG_GUARD) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError as error:  # the connection closed as the server stopped
        return type(error).__name__
