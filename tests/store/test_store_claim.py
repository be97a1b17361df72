"""A run's place is claimed at ``watch()``: of two processes starting a run there at once,
exactly one starts and the other is refused then, and a killed claimer holds nothing."""

import json
import multiprocessing
import os
import re
import socket

import pytest
import torch
from tests.fixtures.claim_race import claim_and_die, claim_in_rounds, watch_at_once

import layerscope
from layerscope.store._claim import CLAIM_FILE

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")
pytest.importorskip("fcntl")  # no flock: a place is taken once its run.json is there

ROUNDS = 10
TIMEOUT = 120


def _started(target, *args, processes=2):
    """``processes`` spawned processes running ``target(*args)``, started together."""
    context = multiprocessing.get_context("spawn")
    children = [context.Process(target=target, args=args) for _ in range(processes)]
    for child in children:
        child.start()
    return children


def _joined(children):
    for child in children:
        child.join(TIMEOUT)
    assert [child.exitcode for child in children] == [0] * len(children)


def test_of_two_processes_claiming_a_place_at_once_exactly_one_gets_it(tmp_path):
    places = [tmp_path / f"run-{n}" for n in range(ROUNDS)]
    for place in places:
        place.mkdir()
    places = [str(place) for place in places]
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(2), context.Queue()
    children = _started(claim_in_rounds, places, barrier, results)
    outcomes = [results.get(timeout=TIMEOUT) for _ in range(2 * ROUNDS)]
    _joined(children)
    for place in places:
        mine = sorted(outcome for where, outcome in outcomes if where == place)
        assert mine[0] == "claimed", mine
        assert mine[1].startswith(f"refused: run: {place} is being written by another process")
    assert not list(tmp_path.glob(f"*/{CLAIM_FILE}"))  # let go, its file removed


def test_two_watches_given_the_same_run_at_once_start_one_and_refuse_the_other(tmp_path):
    path = str(tmp_path / "run")
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(2), context.Queue()
    # This process is the other one: a second torch to start would cost seconds.
    children = _started(watch_at_once, path, barrier, results, processes=1)
    watch_at_once(path, barrier, results)
    outcomes = sorted(results.get(timeout=TIMEOUT) for _ in range(2))
    _joined(children)
    assert outcomes[0].startswith(f"refused: run: {path} ")  # at watch(), naming the run
    assert outcomes[1] == "started"
    run = layerscope.load(path)
    assert run.meta["status"] == "finished"
    assert run.scalars.value.tolist() == [1.0]


def test_a_place_a_killed_process_claimed_is_free_again(tmp_path):
    place = tmp_path / "run"
    place.mkdir()
    context = multiprocessing.get_context("spawn")
    claimed = context.Event()
    (child,) = _started(claim_and_die, str(place), claimed, processes=1)
    child.join(TIMEOUT)
    assert claimed.is_set()
    assert child.exitcode == -9
    assert (place / CLAIM_FILE).exists()  # its file stays; its lock went with it
    model = torch.nn.Linear(2, 2)
    with layerscope.watch(model, every=1, run=place) as scope:
        model(torch.ones(1, 2)).sum().backward()
        scope.step(loss=2.0)
    assert layerscope.load(place).scalars.value.tolist() == [2.0]


def test_watch_writes_run_json_at_once_and_holds_its_place_until_close(tmp_path):
    model = torch.nn.Linear(2, 2)
    scope = layerscope.watch(model, every=1, run=tmp_path / "run")
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert (meta["status"], meta["steps"], meta["written_rows"]) == ("running", 0, 0)
    holder = re.escape(f"another process (pid {os.getpid()} on host {socket.gethostname()!r})")
    with pytest.raises(FileExistsError, match=rf"^run: .* is being written by {holder}"):
        layerscope.watch(torch.nn.Linear(2, 2), run=tmp_path / "run")
    scope.close()
    assert not (tmp_path / "run" / CLAIM_FILE).exists()
    with pytest.raises(FileExistsError, match=r"^run: .* already holds a run"):
        layerscope.watch(torch.nn.Linear(2, 2), run=tmp_path / "run")
    assert layerscope.load(tmp_path / "run").meta["status"] == "finished"
