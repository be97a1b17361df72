"""What stands where a run's file should be: a FIFO, a device, a file too large, a Parquet file
damaged past its footer. Every reader returns (a guard fails the test instead of hanging),
names the file and says why, and reads the rest."""

import contextlib
import os
import shutil
import threading
import warnings

import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

import layerscope
from layerscope import LayerscopeWarning
from layerscope.cli import main
from layerscope.store import ParquetStore, RunFileError

pytest.importorskip("duckdb")
needs_fifos = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
needs_dev_zero = pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")

STEPS = 4
UNREADABLE = "its footer is sound but its data cannot be read"
SEGMENT = "stats/seg-000002.parquet"  # step 1's rows
GUARD_SECONDS = 30  # a reader that blocks fails the test after this, instead of hanging it


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    """A run of a segment per step (compaction off, as a live run has)."""
    path = tmp_path_factory.mktemp("special") / "original"
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    store = ParquetStore(path, flush_steps=1)
    store._compact = lambda table: None
    with layerscope.watch(model, run=store, every=1, alerts=False) as scope:
        for _ in range(STEPS):
            loss = model(torch.randn(4, 3)).pow(2).mean()
            loss.backward()
            scope.step(loss=loss)
    return path


@pytest.fixture
def run_dir(original, tmp_path):
    copy = tmp_path / "runs" / "run"
    shutil.copytree(original, copy)
    return copy


@pytest.fixture
def fifo():
    """Makes a FIFO in a file's place; a reader still waiting on one is let go at the end."""
    made = []

    def make(path):
        path.unlink()
        os.mkfifo(path)
        made.append(path)
        return str(path)

    yield make
    for path in made:
        # A writer's open lets a reader blocked on the FIFO go (it reads nothing); with no
        # reader waiting, the open fails.
        with contextlib.suppress(OSError):
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def within_guard(function, *args):
    """``function(*args)``, or a failure if it has not returned in ``GUARD_SECONDS``."""
    outcome = {}

    def call():
        try:
            outcome["value"] = function(*args)
        except BaseException as error:  # handed to the test's thread below
            outcome["error"] = error

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(GUARD_SECONDS)
    if thread.is_alive():
        pytest.fail(f"{function.__name__}{args} still blocked after {GUARD_SECONDS} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def quietly(function, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LayerscopeWarning)
        return within_guard(function, *args)


def stats_steps(path):
    """The steps of the run's stats, through pyarrow and through DuckDB, and what it skipped."""

    def read():
        run = layerscope.load(path)
        return (
            sorted(set(run.stats.step)),
            run.sql("select distinct step from stats order by 1").step.tolist(),
            run.skipped,
        )

    return quietly(read)


def commands_name(path, target, capsys):
    """``summary`` of the run and ``runs`` of its folder return, and name ``target``."""
    status = quietly(main, ["summary", str(path), "--plain"])
    captured = capsys.readouterr()
    assert status in (0, 2)
    assert target in captured.out + captured.err
    assert quietly(main, ["runs", str(path.parent), "--plain"]) == 0
    capsys.readouterr()


@needs_fifos
def test_a_fifo_as_run_json_is_named_not_waited_on(run_dir, fifo, capsys):
    target = fifo(run_dir / "run.json")
    with pytest.raises(RunFileError, match="a FIFO, not a regular file") as raised:
        within_guard(layerscope.load, run_dir)
    assert raised.value.path == target
    listed = within_guard(layerscope.runs, run_dir.parent)
    assert listed.status.tolist() == ["unreadable"]
    assert target in listed.error[0]
    commands_name(run_dir, target, capsys)


@needs_fifos
def test_a_fifo_as_modules_json_is_named_not_waited_on(run_dir, fifo, capsys):
    target = fifo(run_dir / "modules.json")
    run = within_guard(layerscope.load, run_dir)
    with pytest.raises(RunFileError, match="a FIFO, not a regular file") as raised:
        within_guard(lambda: run.modules)
    assert raised.value.path == target
    assert len(quietly(lambda: run.stats)) > 0
    assert quietly(main, ["summary", str(run_dir), "--plain"]) in (0, 2)
    capsys.readouterr()


@needs_fifos
def test_a_fifo_as_a_segment_is_left_out_named_and_the_rest_read(run_dir, fifo, capsys):
    target = fifo(run_dir / SEGMENT)
    pyarrow_steps, duckdb_steps, skipped = stats_steps(run_dir)
    assert pyarrow_steps == duckdb_steps == [0, 2, 3]
    assert skipped[target] == "a FIFO, not a regular file"
    commands_name(run_dir, target, capsys)


@needs_fifos
def test_a_fifo_as_calls_parquet_is_left_out_named(run_dir, fifo, capsys):
    target = fifo(run_dir / "calls.parquet")
    run = within_guard(layerscope.load, run_dir)
    assert len(quietly(lambda: run.calls)) == 0
    assert quietly(run.sql, "select count(*) n from calls").n[0] == 0
    assert run.skipped[target] == "a FIFO, not a regular file"
    commands_name(run_dir, target, capsys)


@needs_dev_zero
def test_a_link_to_dev_zero_is_refused_not_read_without_end(run_dir):
    (run_dir / "run.json").unlink()
    (run_dir / "run.json").symlink_to("/dev/zero")
    with pytest.raises(RunFileError, match="a character device, not a regular file"):
        within_guard(layerscope.load, run_dir)


@needs_dev_zero
def test_a_segment_linking_to_dev_zero_is_left_out_named(run_dir):
    (run_dir / SEGMENT).unlink()
    (run_dir / SEGMENT).symlink_to("/dev/zero")
    pyarrow_steps, duckdb_steps, skipped = stats_steps(run_dir)
    assert pyarrow_steps == duckdb_steps == [0, 2, 3]
    assert skipped[str(run_dir / SEGMENT)] == "a character device, not a regular file"


@pytest.mark.parametrize("name", ["run.json", "modules.json"])
def test_json_larger_than_the_bound_is_refused_by_its_size(run_dir, name):
    from layerscope.store._regular_files import JSON_LIMIT

    with open(run_dir / name, "r+b") as file:  # sparse: no disk taken
        file.truncate(JSON_LIMIT + 1)
    with pytest.raises(RunFileError, match="larger than 64 MiB: not read") as raised:
        within_guard(lambda: layerscope.load(run_dir).modules)
    assert raised.value.path == str(run_dir / name)


def corrupt_pages(path):
    """Garble every 7th byte between the magic and the footer: the footer stays sound."""
    data = bytearray(path.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little")
    for index in range(4, len(data) - 8 - footer, 7):
        data[index] ^= 0x5A
    path.write_bytes(bytes(data))


def claim_rows(path, rows):
    """Rewrite the footer's row counts (file, row group, column chunk) as ``rows``."""

    def varint(value):  # Thrift's compact protocol: an i64 field, zigzag varint
        value, out = value * 2, bytearray()
        while value >= 0x80:
            out.append(value & 0x7F | 0x80)
            value >>= 7
        return bytes([*out, value])

    data = path.read_bytes()
    size = int.from_bytes(data[-8:-4], "little")
    footer = data[-8 - size : -8]
    real = pq.read_metadata(path).num_rows
    changed = footer.replace(b"\x16" + varint(real), b"\x16" + varint(rows))
    assert changed != footer
    path.write_bytes(data[: -8 - size] + changed + len(changed).to_bytes(4, "little") + b"PAR1")


@pytest.mark.parametrize("first", ["sql", "frame"])
@pytest.mark.parametrize("table", ["stats", "scalars"])
def test_corrupt_pages_behind_a_sound_footer_leave_that_file_out_named(run_dir, table, first):
    target = run_dir / table / "seg-000002.parquet"
    corrupt_pages(target)
    assert pq.read_metadata(target).num_rows > 0  # the footer still reads
    run = layerscope.load(run_dir)
    reads = {  # DuckDB's reading and pyarrow's, either the first to meet the damage
        "sql": lambda: run.sql(f"select distinct step from {table} order by 1").step.tolist(),
        "frame": lambda: sorted(set(getattr(run, table).step)),
    }
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LayerscopeWarning)
        assert reads[first]() == [0, 2, 3]
    assert any(f"skipped {target}," in str(warning.message) for warning in caught)
    assert UNREADABLE in run.skipped[str(target)]
    assert quietly(reads["frame" if first == "sql" else "sql"]) == [0, 2, 3]


def test_summary_and_diff_of_a_run_with_corrupt_pages_answer_naming_the_file(run_dir, capsys):
    corrupt_pages(run_dir / SEGMENT)
    assert quietly(main, ["summary", str(run_dir), "--plain"]) == 0
    captured = capsys.readouterr()
    assert str(run_dir / SEGMENT) in captured.out + captured.err
    assert quietly(main, ["diff", str(run_dir), str(run_dir), "--plain"]) == 0
    assert "traceback" not in capsys.readouterr().err.lower()


def test_a_footer_claiming_2_to_the_62_rows_is_left_out_named(run_dir):
    claim_rows(run_dir / SEGMENT, 2**62)
    pyarrow_steps, duckdb_steps, skipped = stats_steps(run_dir)
    assert pyarrow_steps == duckdb_steps == [0, 2, 3]
    reason = skipped[str(run_dir / SEGMENT)]
    assert reason.startswith(f"its footer claims {2**62} rows, more than")
