"""Faults while a run is written: a full disk, and a kill that leaves a temporary behind."""

import errno
import json
import time
import uuid

import fsspec
import pytest
import torch
from fsspec.implementations.memory import MemoryFile, MemoryFileSystem
from tests.cli.cli_runs import tiny_model

import layerscope
from layerscope import LayerscopeWarning
from layerscope.distributed._ranks import ProcessRank
from layerscope.sinks._base import Records, RunInfo, RunSummary
from layerscope.store import ParquetStore
from layerscope.store._compaction import compact
from layerscope.store._run_meta import LAST_WRITE_WAITS, RESERVE_FILE, RunFile
from layerscope.store._temporaries import remove_stale_temporaries

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")


class SmallDisk(MemoryFileSystem):
    """An in-memory disk: a write past ``capacity`` bytes in all, or one ``refuse`` picks, fails
    with ENOSPC, as on a full disk. Removing a file frees its bytes; a rename needs none."""

    protocol = "smalldisk"
    store = {}  # noqa: RUF012  # its own, apart from memory://
    pseudo_dirs = [""]  # noqa: RUF012
    capacity = None
    refuse = None  # (path, bytes) -> whether this write fails

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, str):
            path = path.removeprefix(f"{cls.protocol}://")
        return super()._strip_protocol(path)

    def used(self):
        return sum(file.size for file in self.store.values())

    def _open(self, path, mode="rb", **kwargs):
        if "w" not in mode:
            return super()._open(path, mode, **kwargs)
        file = _DiskFile(self, self._strip_protocol(path))
        file.commit()
        return file


class _DiskFile(MemoryFile):
    def write(self, data):
        capacity, refuse = SmallDisk.capacity, SmallDisk.refuse  # the class's: not methods
        full = capacity is not None and self.fs.used() + memoryview(data).nbytes > capacity
        if full or (refuse is not None and refuse(self.path, bytes(data))):
            raise OSError(errno.ENOSPC, "No space left on device", self.path)
        return super().write(data)


@pytest.fixture
def disk():
    fsspec.register_implementation(SmallDisk.protocol, SmallDisk, clobber=True)
    SmallDisk.store.clear()
    SmallDisk.pseudo_dirs[:] = [""]
    yield fsspec.filesystem(SmallDisk.protocol)
    SmallDisk.capacity = SmallDisk.refuse = None
    SmallDisk.store.clear()


def _train(path, steps, at_step=None):
    """Train the tiny model ``steps`` steps, every one recorded; ``at_step(scope, step)`` after
    each. Returns the scope, closed."""
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = torch.randn(steps, 8, 4, generator=torch.Generator().manual_seed(1))
    store = ParquetStore(path, flush_steps=1)
    with layerscope.watch(model, optimizer=optimizer, run=store, every=1, alerts=False) as scope:
        for step, batch in enumerate(batches):
            model(batch).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step(loss=float(step))
            if at_step is not None:
                at_step(scope, step)
    return scope


def _meta(fs, place):
    return json.loads(fs.cat(f"{place}/run.json"))


def test_a_disk_full_to_the_end_says_the_run_finished_and_counts_what_it_lost(disk):
    def fill_at_20(scope, step):
        if step == 20:
            scope._catch_up()  # every step so far is on disk
            SmallDisk.capacity = disk.used()  # full from here on: no segment fits

    with pytest.warns(LayerscopeWarning, match="No space left"):
        scope = _train("smalldisk://runs/full", steps=80, at_step=fill_at_20)
    meta = _meta(disk, "runs/full")
    run = layerscope.load("smalldisk://runs/full")
    assert run.meta["status"] == meta["status"] == "finished"
    assert meta["steps"] == 80
    assert meta["dropped_rows"] > 0
    assert meta["recorded_rows"] - meta["dropped_rows"] == meta["written_rows"] == len(run.stats)
    assert (meta["written_scalars"], meta["dropped_scalars"]) == (len(run.scalars), 80 - 21)
    assert meta["failures"] == scope.failures > 0
    assert meta["stats_last_step"] == run.stats.step.max() == 20
    assert meta["scalars_last_step"] == run.scalars.step.max() == 20
    assert meta["alerts_last_step"] is None  # no rules, no alerts
    assert not [path for path in disk.find("runs/full") if path.endswith((RESERVE_FILE, ".tmp"))]


def test_without_its_reserve_a_full_disk_would_leave_run_json_running(disk, monkeypatch):
    # The control of the test above: what the reserve is for.
    monkeypatch.setattr(RunFile, "hold_reserve", lambda self: None)

    def fill_at_20(scope, step):
        if step == 20:
            scope._catch_up()
            SmallDisk.capacity = disk.used()

    with pytest.warns(LayerscopeWarning, match="No space left"):
        _train("smalldisk://runs/bare", steps=40, at_step=fill_at_20)
    meta = _meta(disk, "runs/bare")
    assert meta["status"] == "running"
    assert meta["dropped_rows"] == meta["failures"] == 0


def test_a_disk_full_when_watch_starts_is_said_by_watch_and_leaves_nothing(disk):
    SmallDisk.capacity = 0
    with pytest.raises(OSError, match=r"^run: cannot write the run's files in smalldisk://runs/no"):
        layerscope.watch(tiny_model(), run="smalldisk://runs/none")
    assert not disk.exists("runs/none")


def _train_on_a_disk_full_once_watched(disk, path, steps):
    model = tiny_model()
    with layerscope.watch(model, run=ParquetStore(path, flush_steps=1), alerts=False) as scope:
        SmallDisk.capacity = disk.used()  # full from the first step on
        for step in range(steps):
            model(torch.randn(8, 4)).pow(2).mean().backward()
            scope.step(loss=float(step))
    return scope


def test_a_disk_full_before_the_first_flush_still_leaves_run_json_saying_what_was_lost(disk):
    with pytest.warns(LayerscopeWarning, match="No space left"):
        scope = _train_on_a_disk_full_once_watched(disk, "smalldisk://runs/soon", steps=3)
    meta = _meta(disk, "runs/soon")
    assert (meta["status"], meta["steps"], meta["written_rows"]) == ("finished", 3, 0)
    assert meta["dropped_rows"] == meta["recorded_rows"] > 0
    assert (meta["written_scalars"], meta["dropped_scalars"]) == (0, 3)
    assert meta["failures"] == scope.failures > 0


def test_rows_come_back_once_space_frees_up_and_the_counts_stay_right(disk):
    seen = {}

    def fill_at_20_free_at_50(scope, step):
        if step in (20, 50, 55):
            scope._catch_up()  # every step so far is on disk, or dropped
        if step == 20:
            SmallDisk.capacity = disk.used()
        elif step == 50:
            seen["full"] = _meta(disk, "runs/freed")
            seen["failures while full"] = scope.failures
            seen["reserve while full"] = disk.exists(f"runs/freed/{RESERVE_FILE}")
            SmallDisk.capacity = None
        elif step == 55:
            seen["freed"] = _meta(disk, "runs/freed")
            seen["reserve when freed"] = disk.exists(f"runs/freed/{RESERVE_FILE}")
            seen["failures"] = scope.failures
            # The reserve is hidden from readers.
            seen["steps read"] = sorted(set(layerscope.load("smalldisk://runs/freed").stats.step))

    lost = list(range(21, 51))
    with pytest.warns(LayerscopeWarning, match="No space left"):
        scope = _train("smalldisk://runs/freed", steps=80, at_step=fill_at_20_free_at_50)
    kept = [step for step in range(80) if step not in lost]
    run = layerscope.load("smalldisk://runs/freed")
    assert sorted(set(run.stats.step)) == kept
    assert sorted(run.scalars.step) == kept

    # While the disk was full, run.json went on in the reserve's space, with the counts.
    full = seen["full"]
    assert not seen["reserve while full"]
    assert full["status"] == "running"
    assert full["steps"] == 51
    assert full["stats_last_step"] == full["scalars_last_step"] == 20
    assert full["dropped_scalars"] == len(lost)
    assert full["recorded_rows"] - full["dropped_rows"] == full["written_rows"]
    # One for each flush that lost rows: as many as the scope counted, at least one a step.
    assert full["failures"] == seen["failures while full"] >= len(lost)

    # Once space was back, the reserve was made again and rows written again.
    freed = seen["freed"]
    assert seen["reserve when freed"]
    assert seen["steps read"] == [step for step in kept if step <= 55]
    assert freed["stats_last_step"] == freed["scalars_last_step"] == 55
    assert freed["dropped_scalars"] == len(lost)
    assert freed["failures"] == seen["failures"] == full["failures"]
    assert freed["recorded_rows"] - freed["dropped_rows"] == freed["written_rows"]

    meta = _meta(disk, "runs/freed")
    assert meta["status"] == "finished"
    assert meta["steps"] == 80
    assert meta["written_rows"] == len(run.stats)
    rows_per_step = len(run.stats) // len(kept)
    assert meta["dropped_rows"] == meta["recorded_rows"] - len(run.stats) == 30 * rows_per_step
    assert (meta["written_scalars"], meta["dropped_scalars"]) == (len(kept), len(lost))
    assert meta["failures"] == scope.failures == full["failures"]
    assert meta["stats_last_step"] == meta["scalars_last_step"] == 79
    assert not disk.exists(f"runs/freed/{RESERVE_FILE}")


def _store_with_rows(path, steps=2):
    """A store started and given ``steps`` flushes of a scalar each, all written."""
    store = ParquetStore(path, flush_steps=1)
    store.start(RunInfo("id", "r", time.time(), ProcessRank(), {}, [], None))
    for step in range(steps):
        store.write(Records(scalars=[(step, "loss", 1.0 / (step + 1))]))
        store.flush()
    store.sync()
    return store


def _finished(steps):
    return RunSummary("finished", time.time(), steps, 0, 0, 0)


def test_the_last_run_json_is_tried_again_until_there_is_room(disk):
    store = _store_with_rows("smalldisk://runs/late")
    assert disk.exists(f"runs/late/{RESERVE_FILE}")
    tries = []  # (seconds, refused) of each write of the last run.json

    def refuse_the_last_for_a_while(path, data):
        if ".run.json." not in path or b'"status": "finished"' not in data:
            return False
        now = time.monotonic()
        refused = not tries or now < tries[0][0] + 0.3
        tries.append((now, refused))
        return refused

    SmallDisk.refuse = refuse_the_last_for_a_while
    store.close(_finished(2))
    meta = _meta(disk, "runs/late")
    assert meta["status"] == "finished"
    assert meta["written_scalars"] == 2
    assert tries[0][1]
    assert not tries[-1][1]
    assert tries[-1][0] - tries[0][0] >= 0.3
    assert len(tries) >= 3  # the first, the one the reserve made room for, one after a wait
    assert not disk.exists(f"runs/late/{RESERVE_FILE}")


def test_a_last_run_json_that_never_fits_is_given_up_after_a_bounded_time(disk):
    store = _store_with_rows("smalldisk://runs/never")
    SmallDisk.refuse = lambda path, data: ".run.json." in path and b'"finished"' in data
    started = time.monotonic()
    with pytest.raises(OSError, match="No space left"):
        store.close(_finished(2))
    assert sum(LAST_WRITE_WAITS) <= time.monotonic() - started < sum(LAST_WRITE_WAITS) + 5
    assert _meta(disk, "runs/never")["status"] == "running"  # as of the last flush
    assert not disk.exists(f"runs/never/{RESERVE_FILE}")
    assert not [path for path in disk.find("runs/never") if path.endswith(".tmp")]


def test_a_discarded_store_leaves_no_reserve(tmp_path):
    store = _store_with_rows(tmp_path / "r")
    assert (tmp_path / "r" / RESERVE_FILE).exists()
    store.discard()
    assert not (tmp_path / "r").exists()


def test_a_run_written_whole_has_no_reserve_and_its_last_steps(tmp_path):
    _train(tmp_path / "r", steps=4)
    meta = json.loads((tmp_path / "r" / "run.json").read_text())
    assert (meta["stats_last_step"], meta["scalars_last_step"], meta["alerts_last_step"]) == (
        3,
        3,
        None,
    )
    assert meta["dropped_rows"] == meta["failures"] == 0
    assert sorted(path.name for path in (tmp_path / "r").iterdir() if path.is_file()) == [
        "calls.parquet",
        "modules.json",
        "run.json",
    ]


def test_run_json_says_where_each_table_ends_when_they_end_apart(tmp_path, monkeypatch):
    write_table = ParquetStore._write_table
    refusing = []

    def stats_refused(self, relative, *args):
        if refusing and relative.startswith("stats/"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_table(self, relative, *args)

    def refuse_stats_after_10(scope, step):
        if step == 10:
            scope._catch_up()
            refusing.append(True)

    monkeypatch.setattr(ParquetStore, "_write_table", stats_refused)
    with pytest.warns(LayerscopeWarning, match="No space left"):
        _train(tmp_path / "r", steps=30, at_step=refuse_stats_after_10)
    run = layerscope.load(tmp_path / "r")
    assert run.meta["stats_last_step"] == run.stats.step.max() == 10
    assert run.meta["scalars_last_step"] == run.scalars.step.max() == 29
    assert run.meta["dropped_rows"] == run.meta["recorded_rows"] - len(run.stats) > 0


# ---------------------------------------------------------------- temporaries


class _Killed(BaseException):
    pass


class _KilledBeforeRename:
    """A filesystem whose process dies once a temporary is written, before its rename: the
    temporary stays, as nothing of a dead process removes it."""

    def __init__(self, fs):
        self._fs = fs
        self.dead = False

    def __getattr__(self, name):
        return getattr(self._fs, name)

    def mv(self, *args, **kwargs):
        self.dead = True
        raise _Killed

    def rm(self, *args, **kwargs):
        if not self.dead:
            self._fs.rm(*args, **kwargs)


def _tree(root):
    """Every file under ``root``: its bytes by its path there."""
    files = [path for path in root.rglob("*") if path.is_file()]
    return {str(path.relative_to(root)): path.read_bytes() for path in files}


def test_a_compaction_killed_before_its_rename_leaves_a_temporary_that_is_removed(tmp_path):
    _store_with_rows(tmp_path / "r", steps=3)  # its process is killed: the store never closes
    fs = fsspec.filesystem("file")
    place = str(tmp_path / "r")
    with pytest.raises(_Killed):
        compact(_KilledBeforeRename(fs), f"{place}/scalars")
    left = [path for path in (tmp_path / "r" / "scalars").iterdir() if path.name.endswith(".tmp")]
    assert [path.name[:28] for path in left] == [".data-000001-000003.parquet."]
    before = _tree(tmp_path / "r")

    assert remove_stale_temporaries(fs, place) == [str(left[0])]
    after = _tree(tmp_path / "r")
    assert after == {name: data for name, data in before.items() if not name.endswith(".tmp")}
    assert "scalars/seg-000003.parquet" in after
    assert RESERVE_FILE in after  # the killed writer's reserve is no temporary
    assert layerscope.load(tmp_path / "r").scalars.value.tolist() == [1.0, 0.5, 1 / 3]
    assert remove_stale_temporaries(fs, place) == []


def test_only_the_temporaries_of_a_writers_files_are_removed(tmp_path):
    place = tmp_path / "r"
    for table in ("stats", "scalars", "alerts"):
        (place / table).mkdir(parents=True)
    stale = [
        f".run.json.{uuid.uuid4().hex[:8]}.tmp",
        f".calls.parquet.{uuid.uuid4().hex[:8]}.tmp",
        f"stats/.seg-000004.parquet.{uuid.uuid4().hex[:8]}.tmp",
        f"alerts/.data-000001-000200.parquet.{uuid.uuid4().hex[:8]}.tmp",
    ]
    kept = [
        "stats/seg-000003.parquet",
        "scalars/data-000001-000002.parquet",
        "run.json",
        RESERVE_FILE,
        ".run.json.notahex!.tmp",  # not a name atomic_write makes
        ".run.json.ABCDEF12.tmp",  # uuid hex is lower case
        ".notes.txt.0badcafe.tmp",  # no file of a writer
        "stats/.run.json.0badcafe.tmp",  # run.json is never in a table's directory
        ".seg-000001.parquet.0badcafe.tmp",  # nor a segment outside one
        "stats/.seg-000001.parquet.0badcafe.tmp.bak",
        "rank-00001/.run.json.0badcafe.tmp",  # another rank's place: cleaned on its own
    ]
    for name in stale + kept:
        (place / name).parent.mkdir(parents=True, exist_ok=True)
        (place / name).write_bytes(b"x")
    fs = fsspec.filesystem("file")
    removed = remove_stale_temporaries(fs, str(place))
    assert sorted(removed) == sorted(str(place / name) for name in stale)
    assert sorted(_tree(place)) == sorted(kept)


def test_a_writer_opening_a_place_removes_what_a_killed_writer_left_there(tmp_path):
    place = tmp_path / "r"
    (place / "stats").mkdir(parents=True)
    stale = [
        place / f".run.json.{uuid.uuid4().hex[:8]}.tmp",  # killed writing its first run.json
        place / "stats" / f".seg-000001.parquet.{uuid.uuid4().hex[:8]}.tmp",
    ]
    for path in stale:
        path.write_bytes(b"half a file")
    (place / "stats" / ".notes").write_text("mine")  # hidden, not a name layerscope makes
    _train(place, steps=3)
    assert not any(path.exists() for path in stale)
    assert (place / "stats" / ".notes").read_text() == "mine"
    run = layerscope.load(place)
    assert run.meta["status"] == "finished"
    assert sorted(set(run.stats.step)) == [0, 1, 2]
    assert not (place / RESERVE_FILE).exists()


def test_a_transaction_on_fsspecs_shared_filesystem_holds_back_no_file_of_the_run(tmp_path):
    # Lightning saves each checkpoint inside a transaction of fsspec's shared local
    # filesystem; files opened on that object meanwhile are written only when it commits.
    shared = fsspec.filesystem("file")
    model = torch.nn.Linear(2, 2)
    with shared.transaction:
        with layerscope.watch(model, every=1, run=tmp_path / "run") as scope:
            for _ in range(2):
                model(torch.ones(1, 2)).sum().backward()
                scope.step()
        run = layerscope.load(tmp_path / "run")  # before the transaction commits
        assert run.meta["status"] == "finished"
        assert sorted(set(run.stats.step)) == [0, 1]
    assert scope.failures == 0
