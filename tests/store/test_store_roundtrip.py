"""The run store written by watch(run=...) and read back by load()."""

import copy
import errno
import itertools
import json
import math
import threading
import time
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import layerscope
from layerscope import LayerscopeWarning
from layerscope.store import ParquetStore

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")

CUSTOM = {
    "rms": lambda t: t.pow(2).mean().sqrt(),
    "q": lambda t: t.quantile(torch.tensor([0.25, 0.75], dtype=t.dtype)),
}


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


def _train(model, steps, every=1, run=None, sinks=(), eval_every=0):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(1)
    scope = layerscope.watch(
        model,
        optimizer=optimizer,
        every=every,
        run=run,
        sinks=sinks,
        kinds=("activation", "grad", "weight", "weight_grad", "update"),
        stats=[*layerscope.stats.BUILTIN_STATS, CUSTOM],
    )
    with scope:
        for step in range(steps):
            loss = model(torch.randn(4, 6, generator=generator)).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step(loss=loss, lr=0.05)
            if eval_every and step % eval_every == 0:
                with torch.no_grad():
                    model(torch.randn(2, 6, generator=generator))
    return scope


def _assert_frames_equal(expected, actual):
    assert list(actual.columns) == list(expected.columns)
    assert len(actual) == len(expected)
    for column in expected.columns:
        for want, got in zip(expected[column], actual[column], strict=True):
            if isinstance(want, np.ndarray) or isinstance(got, np.ndarray):
                np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=column)
            elif isinstance(want, float) and np.isnan(want):
                assert np.isnan(got), column
            else:
                assert got == want, (column, want, got)


def test_load_gives_back_what_an_in_memory_run_recorded(tmp_path):
    in_memory = _train(_model(), steps=6, eval_every=2)
    on_disk = _train(_model(), steps=6, eval_every=2, run=tmp_path / "run")
    run = layerscope.load(tmp_path / "run")

    _assert_frames_equal(in_memory.frame(), run.stats)
    # Stored tables have the rank that wrote each row; a single process is rank 0.
    assert run.scalars["rank"].tolist() == [0] * len(run.scalars)
    assert run.calls["rank"].tolist() == [0] * len(run.calls)
    _assert_frames_equal(in_memory.frame("scalars"), run.scalars.drop(columns="rank"))
    _assert_frames_equal(in_memory.frame("calls"), run.calls.drop(columns="rank"))
    _assert_frames_equal(on_disk.frame(), run.stats)  # frame() of a stored run reads the store
    _assert_frames_equal(in_memory.frame("alerts"), run.alerts.drop(columns="rank"))
    assert list(run.alerts.columns) == [*in_memory.frame("alerts").columns, "rank"]
    assert {"eval", "train"} == set(run.stats.phase)


def test_run_json_holds_identity_versions_config_and_counters(tmp_path):
    _train(_model(), steps=3, run=tmp_path / "exp")
    meta = layerscope.load(tmp_path / "exp").meta
    assert meta["name"] == "exp"
    assert meta["status"] == "finished"
    assert meta["ended"] >= meta["started"]
    assert meta["versions"]["torch"] == torch.__version__
    assert meta["versions"]["layerscope"] == layerscope.__version__
    assert meta["config"]["every"]["every"] == 1
    assert meta["config"]["custom_stats"] == ["rms", "q"]
    assert meta["steps"] == 3
    rows = len(layerscope.load(tmp_path / "exp").stats)
    assert meta["recorded_rows"] == meta["written_rows"] == rows
    assert meta["dropped_rows"] == 0
    assert len(meta["histogram_edges"]) == 256
    modules = layerscope.load(tmp_path / "exp").modules
    assert [m.name for m in modules if m.watched] == ["0", "1", "2"]
    assert modules[1].parameters == {"weight": (8, 6), "bias": (8,)}


def test_a_failed_with_block_marks_the_run_failed(tmp_path):
    model = _model()

    def fail_inside():
        with layerscope.watch(model, run=tmp_path / "r"):
            model(torch.ones(1, 6))
            raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        fail_inside()
    assert layerscope.load(tmp_path / "r").meta["status"] == "failed"


def test_an_existing_run_is_never_overwritten(tmp_path):
    _train(_model(), steps=1, run=tmp_path / "r")
    before = (tmp_path / "r" / "run.json").read_text()
    model = _model()
    with pytest.raises(FileExistsError, match="already holds a run"):
        layerscope.watch(model, run=tmp_path / "r")
    assert (tmp_path / "r" / "run.json").read_text() == before
    assert all(not m._forward_hooks for m in model.modules())


def test_segments_are_written_while_training_and_compacted_at_close(tmp_path):
    store = ParquetStore(tmp_path / "r", flush_steps=2, flush_seconds=60)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with layerscope.watch(model, optimizer=optimizer, every=1, run=store) as scope:
        for _ in range(6):
            model(torch.randn(2, 6)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step(loss=1.0)
        scope._pipeline.drain()
        segments = sorted(p.name for p in (tmp_path / "r" / "stats").iterdir())
        assert len(segments) >= 3
        assert all(name.startswith("seg-") for name in segments)
        live = layerscope.load(tmp_path / "r")
        assert live.meta["status"] == "running"
        assert sorted(set(live.stats.step)) == list(range(6))
    files = sorted(p.name for p in (tmp_path / "r" / "stats").iterdir())
    assert len(files) == 1
    assert files[0].startswith("data-000001-")
    assert sorted(set(layerscope.load(tmp_path / "r").stats.step)) == list(range(6))


@pytest.mark.parametrize("row_group", [7, 1 << 15])
def test_compaction_keeps_every_row_of_segments_whose_columns_differ(
    tmp_path, monkeypatch, row_group
):
    # Sentinel rows lack most statistics, and custom ones, which the recorded steps' rows have:
    # segments differ in columns. Compaction writes row groups of at least row_group rows.
    import pyarrow.parquet as pq

    from layerscope.store import _compaction

    monkeypatch.setattr(_compaction, "COMPACTED_ROW_GROUP", row_group)
    store = ParquetStore(tmp_path / "r", flush_steps=1, flush_seconds=60)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    schedule = layerscope.Schedule(start=0, dense=0, every=3, sentinel=True)
    with layerscope.watch(
        model, optimizer=optimizer, every=schedule, run=store, stats=CUSTOM
    ) as scope:
        for _ in range(8):
            model(torch.randn(2, 6)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        # Steps 0, 3 and 6 are recorded; the sentinel's rows of step 7 make a segment alone.
        scope.flush()
        before = layerscope.load(tmp_path / "r").stats
        segments = (tmp_path / "r" / "stats").iterdir()
        assert len({tuple(pq.read_schema(path).names) for path in segments}) > 1
    after = layerscope.load(tmp_path / "r").stats
    stats_files = list((tmp_path / "r" / "stats").iterdir())
    assert len(stats_files) == 1
    key = ["step", "sentinel", "module", "kind", "tensor", "call"]
    before = before.sort_values(key, ignore_index=True)
    after = after.sort_values(key, ignore_index=True)
    assert before.sentinel.any()
    assert not before.sentinel.all()
    _assert_frames_equal(before, after)
    metadata = pq.ParquetFile(stats_files[0]).metadata
    sizes = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
    assert sum(sizes) == len(after)
    if row_group > len(after):
        assert sizes == [len(after)]
    else:
        assert len(sizes) > 1
        assert min(sizes[:-1]) >= row_group
        # Segments larger than a row group are read a row group at a time: compaction holds
        # less than two row groups' rows, whatever the segments' size.
        assert max(sizes) < 2 * row_group


def test_a_crash_between_compaction_and_cleanup_shows_no_row_twice(tmp_path):
    store = ParquetStore(tmp_path / "r", flush_steps=1)
    _train(_model(), steps=4, run=store)
    stats_dir = tmp_path / "r" / "stats"
    rows = len(layerscope.load(tmp_path / "r").stats)
    # Recreate a segment that compaction covered, as if the process died before deleting it.
    compacted = next(stats_dir.iterdir())
    (stats_dir / "seg-000002.parquet").write_bytes(compacted.read_bytes())
    assert len(layerscope.load(tmp_path / "r").stats) == rows


def test_a_damaged_segment_is_skipped_with_a_warning(tmp_path):
    store = ParquetStore(tmp_path / "r", flush_steps=1)
    model = _model()
    with layerscope.watch(model, every=1, run=store) as scope:
        for _ in range(3):
            model(torch.randn(2, 6)).sum().backward()
            scope.step()
        scope._pipeline.drain()
        segments = sorted((tmp_path / "r" / "stats").iterdir())
        segments[1].write_bytes(b"PAR1 this is not a parquet file")
        run = layerscope.load(tmp_path / "r")
        with pytest.warns(LayerscopeWarning) as warned:
            stats = run.stats
        assert sorted(set(stats.step)) == [0, 2]
        # The file is named, and so is the table that lost its rows.
        assert any("seg-000002" in str(w.message) for w in warned)
        assert any("hold 28 rows where run.json counts 42" in str(w.message) for w in warned)
        assert list(run.skipped) == [str(segments[1]), str(tmp_path / "r" / "stats")]
        scope._sink.sinks[0]._compact = lambda table: None  # keep the damage for the next check
    with pytest.warns(LayerscopeWarning) as warned:
        counted = layerscope.load(tmp_path / "r").sql("select count(distinct step) n from stats")
    assert counted.n.item() == 2
    assert any("seg-000002" in str(w.message) for w in warned)


def test_a_reader_thread_sees_rows_only_grow_while_training_writes(tmp_path):
    store = ParquetStore(tmp_path / "r", flush_steps=1, flush_seconds=0.05)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    counts, errors, stop = [], [], threading.Event()

    def read():
        while not stop.is_set():
            try:
                run = layerscope.load(tmp_path / "r")
                counts.append((len(run.stats), len(run.scalars)))
            except FileNotFoundError:
                continue  # run.json not written yet
            except Exception as error:  # any error fails the test below
                errors.append(error)

    with layerscope.watch(model, optimizer=optimizer, every=1, run=store) as scope:
        reader = threading.Thread(target=read)
        reader.start()
        for _ in range(40):
            model(torch.randn(2, 6)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step(loss=0.5)
    stop.set()
    reader.join()
    assert errors == []
    assert len(counts) > 5
    assert all(a <= b for a, b in itertools.pairwise(counts)), counts
    assert counts[-1][1] <= 40


def test_a_full_disk_warns_once_counts_dropped_rows_and_training_goes_on(tmp_path, monkeypatch):
    model = _model()
    reference = copy.deepcopy(model)
    original = ParquetStore._write_table

    def no_space(self, relative, *args):
        if relative.startswith("stats/seg-"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(self, relative, *args)

    monkeypatch.setattr(ParquetStore, "_write_table", no_space)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scope = _train(model, steps=5, run=ParquetStore(tmp_path / "r", flush_steps=1))
    ours = [w for w in caught if issubclass(w.category, LayerscopeWarning)]
    assert len(ours) == 1
    assert "No space left" in str(ours[0].message)
    assert scope.failures >= 5
    meta = json.loads((tmp_path / "r" / "run.json").read_text())
    assert meta["dropped_rows"] > 0
    assert meta["status"] == "finished"
    run = layerscope.load(tmp_path / "r")
    assert len(run.stats) == 0
    assert len(run.scalars) == 10  # scalars were written: only stats segments failed
    _train(reference, steps=5)
    for a, b in zip(reference.parameters(), model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_counters_count_stats_rows_and_scalars_apart(tmp_path, monkeypatch):
    original = ParquetStore._write_table

    def no_space(self, relative, *args):
        if relative.startswith("scalars/seg-"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(self, relative, *args)

    monkeypatch.setattr(ParquetStore, "_write_table", no_space)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        _train(_model(), steps=5, run=ParquetStore(tmp_path / "r", flush_steps=1))
    meta = layerscope.load(tmp_path / "r").meta
    rows = len(layerscope.load(tmp_path / "r").stats)
    assert meta["recorded_rows"] == meta["written_rows"] == rows > 0
    assert meta["dropped_rows"] == 0  # the scalars lost are not rows of the stats table
    assert (meta["written_scalars"], meta["dropped_scalars"]) == (0, 10)

    monkeypatch.setattr(ParquetStore, "_write_table", original)
    _train(_model(), steps=5, run=tmp_path / "good")
    meta = layerscope.load(tmp_path / "good").meta
    assert (meta["written_scalars"], meta["dropped_scalars"]) == (10, 0)


def test_scalars_lost_before_the_store_are_counted_with_its_own(tmp_path):
    from layerscope.distributed._ranks import ProcessRank
    from layerscope.sinks._base import Records, RunInfo, RunSummary

    info = RunInfo("id", "r", time.time(), ProcessRank(), {}, [], None)
    store = ParquetStore(tmp_path / "r")
    store.start(info)
    store.write(Records(scalars=[(0, "loss", 1.0), (1, "loss", 0.5)]))
    summary = RunSummary("finished", time.time(), 2, 0, 0, 0, dropped_scalars=3)
    store.close(summary)
    meta = layerscope.load(tmp_path / "r").meta
    assert (meta["written_scalars"], meta["dropped_scalars"]) == (2, 3)


def test_fsspec_memory_urls_write_read_and_query():
    url = "memory://layerscope-tests/run-a"
    _train(_model(), steps=3, run=url)
    run = layerscope.load(url)
    assert run.meta["status"] == "finished"
    assert sorted(set(run.stats.step)) == [0, 1, 2]
    top = run.sql(
        "select module, max(absmax) m from stats where kind = 'grad' group by 1 order by 1"
    )
    expected = run.stats.query("kind == 'grad'").groupby("module").absmax.max()
    assert top.m.tolist() == pytest.approx(expected.tolist())
    listed = layerscope.runs("memory://layerscope-tests")
    assert listed.name.tolist() == ["run-a"]


def test_sql_joins_tables_and_reads_trimmed_histograms(tmp_path):
    _train(_model(), steps=4, run=tmp_path / "r")
    run = layerscope.load(tmp_path / "r")
    joined = run.sql(
        "select s.step, s.value loss, max(t.l2) l2 from stats t join scalars s "
        "on s.step = t.step and s.name = 'loss' where t.kind = 'weight_grad' group by all "
        "order by 1"
    )
    assert joined.step.tolist() == [0, 1, 2, 3]
    frame = run.stats
    widened = frame.iloc[0]["hist"]
    trimmed = run.sql("select hist_lo, hist from stats limit 1").iloc[0]
    lo = int(trimmed.hist_lo)
    counts = list(trimmed["hist"])
    assert widened[lo : lo + len(counts)].tolist() == counts
    assert widened.sum() == frame.iloc[0]["numel"]


def test_sql_lists_again_when_a_segment_goes_between_listing_and_reading(tmp_path, monkeypatch):
    # As when a run is compacted while it is queried: the first listing names a file that
    # compaction has removed by the time DuckDB reads it.
    _train(_model(), steps=3, run=tmp_path / "r")
    run = layerscope.load(tmp_path / "r")
    listed = type(run)._readable
    gone = [str(tmp_path / "r" / "stats" / "seg-999999.parquet")]

    def stale_once(self, table):
        paths = listed(self, table)
        return [*paths, gone.pop()] if table == "stats" and gone else paths

    monkeypatch.setattr(type(run), "_readable", lambda self, table: stale_once(self, table))
    counted = run.sql("select count(*) n from stats").n.item()
    assert not gone  # the stale listing was used, and failed
    assert counted == len(run.stats)


def test_runs_lists_name_status_steps_and_start(tmp_path):
    _train(_model(), steps=2, run=tmp_path / "a")
    _train(_model(), steps=3, run=tmp_path / "b")
    (tmp_path / "not-a-run").mkdir()
    listed = layerscope.runs(tmp_path)
    assert listed.name.tolist() == ["a", "b"]
    assert listed.steps.tolist() == [2, 3]
    assert set(listed.status) == {"finished"}
    assert listed.started.dtype.kind == "M"


def test_loading_a_missing_run_or_a_newer_schema_fails_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="no run"):
        layerscope.load(tmp_path / "nothing")
    _train(_model(), steps=1, run=tmp_path / "r")
    meta = json.loads((tmp_path / "r" / "run.json").read_text())
    meta["schema"] = 99
    (tmp_path / "r" / "run.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="newer layerscope"):
        layerscope.load(tmp_path / "r")


def test_store_arguments_are_checked():
    with pytest.raises(ValueError, match="flush_steps"):
        ParquetStore("x", flush_steps=0)
    with pytest.raises(ValueError, match="flush_seconds"):
        ParquetStore("x", flush_seconds=0)
    with pytest.raises(TypeError, match="run"):
        layerscope.watch(_model(), run=3)
    with pytest.raises(ValueError, match=r"run: .*empty"):
        ParquetStore("")
    with pytest.raises(TypeError, match="flush_steps"):
        ParquetStore("x", flush_steps=True)
    with pytest.raises(TypeError, match="flush_seconds"):
        ParquetStore("x", flush_seconds="5")
    with pytest.raises(ValueError, match="flush_seconds"):
        ParquetStore("x", flush_seconds=math.nan)
    with pytest.raises(TypeError, match="queue_size"):
        ParquetStore("x", queue_size=2.0)


def test_a_run_directory_that_cannot_be_made_fails_at_watch_naming_run(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    model = _model()
    with pytest.raises(OSError, match="run: cannot make the run directory"):
        layerscope.watch(model, run=tmp_path / "file" / "run")
    assert not any(m._forward_hooks for m in model.modules())


def test_frames_have_matching_dtypes_for_analysis(tmp_path):
    _train(_model(), steps=2, run=tmp_path / "r")
    stats = layerscope.load(tmp_path / "r").stats
    assert stats.step.dtype == np.int64
    assert stats["mean"].dtype == np.float64
    assert pd.api.types.is_integer_dtype(stats.nan_count)


def test_a_segment_is_written_after_flush_seconds_even_between_recorded_steps(tmp_path):
    store = ParquetStore(tmp_path / "r", flush_steps=1000, flush_seconds=0.2)
    model = _model()
    with layerscope.watch(model, every=1, run=store) as scope:
        model(torch.randn(2, 6)).sum().backward()
        scope.step()
        deadline = time.monotonic() + 10
        while not list((tmp_path / "r" / "stats").glob("seg-*.parquet")):
            assert time.monotonic() < deadline, "no segment within 10 s of a 0.2 s cadence"
            time.sleep(0.05)
        assert sorted(set(layerscope.load(tmp_path / "r").stats.step)) == [0]


def test_a_writer_that_falls_behind_drops_rows_and_counts_them(tmp_path):
    class Slow:
        def start(self, info):
            pass

        def write(self, records):
            time.sleep(0.05)

        def flush(self):
            pass

        def close(self, summary):
            pass

    store = ParquetStore(tmp_path / "r", queue_size=1)
    model = _model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with layerscope.watch(model, every=1, run=store, sinks=[Slow()]) as scope:
            for _ in range(20):
                model(torch.randn(2, 6)).sum().backward()
                scope.step()
    assert any("fell behind" in str(w.message) for w in caught)
    meta = layerscope.load(tmp_path / "r").meta
    assert meta["dropped_rows"] > 0
    assert meta["recorded_rows"] + meta["dropped_rows"] == 20 * 14  # 14 rows a step
    assert len(layerscope.load(tmp_path / "r").stats) == meta["recorded_rows"]


def test_segments_carry_the_schema_version_and_load_as_plain_strings(tmp_path):
    import pyarrow.parquet as pq

    from layerscope.store._layout import SCHEMA_VERSION

    _train(_model(), steps=2, run=ParquetStore(tmp_path / "r", flush_steps=1))
    files = sorted((tmp_path / "r" / "stats").glob("*.parquet"))
    assert files
    for file in files:
        metadata = pq.read_metadata(file).metadata
        assert metadata[b"layerscope.schema"] == str(SCHEMA_VERSION).encode()
    stats = layerscope.load(tmp_path / "r").stats
    assert not isinstance(stats.module.dtype, pd.CategoricalDtype)  # written as a dictionary
    assert isinstance(stats.module.iloc[0], str)


@pytest.mark.parametrize(
    ("histogram", "saved"),
    [
        ("log2", {"kind": "log2", "slots": 256}),
        (("linear", -1.0, 1.0, 8), {"kind": "linear", "lo": -1.0, "hi": 1.0, "bins": 8}),
        (None, None),
    ],
)
def test_the_histogram_spec_is_saved_as_data(tmp_path, histogram, saved):
    model = torch.nn.Linear(2, 2)
    with layerscope.watch(model, every=1, histogram=histogram, run=tmp_path / "r") as scope:
        model(torch.ones(1, 2)).sum().backward()
        scope.step()
    assert layerscope.load(tmp_path / "r").meta["config"]["histogram"] == saved
