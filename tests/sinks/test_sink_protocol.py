import warnings

import pytest
import torch
from torch import nn

import layerscope
from layerscope import LayerscopeWarning
from layerscope.sinks import MemorySink, NullSink, Records, RunInfo, RunSummary, Sink


class Recording:
    def __init__(self):
        self.calls = []

    def start(self, info: RunInfo):
        self.calls.append(("start", info.name, len(info.modules)))

    def write(self, records: Records):
        rows = len(records.stats) if records.stats is not None else 0
        self.calls.append(("write", rows, len(records.scalars), len(records.calls)))

    def flush(self):
        self.calls.append(("flush",))

    def close(self, summary: RunSummary):
        self.calls.append(("close", summary.status, summary.steps, summary.recorded_rows))


def _two_steps(sinks, every=1):
    model = nn.Linear(3, 2)
    with layerscope.watch(model, every=every, sinks=sinks) as scope:
        for step in range(2):
            model(torch.ones(1, 3)).sum().backward()
            scope.step(loss=float(step))
    return scope


def test_a_user_sink_sees_start_writes_flushes_and_close_in_order():
    sink = Recording()
    assert isinstance(sink, Sink)
    scope = _two_steps([sink])
    kinds = [call[0] for call in sink.calls]
    assert kinds[0] == "start"
    assert kinds[-1] == "close"
    assert "flush" in kinds
    written = [call for call in sink.calls if call[0] == "write"]
    assert sum(call[1] for call in written) == len(scope.frame()) == 2 * 6
    assert sum(call[2] for call in written) == 2
    # Step 0: enter and exit of the one module; step 1 repeats them: one 'same' event.
    assert sum(call[3] for call in written) == 2 + 1
    assert sink.calls[-1] == ("close", "finished", 2, 12)


def test_memory_and_null_sinks():
    memory = MemorySink()
    scope = _two_steps([memory, NullSink()])
    assert memory.scalars == [(0, "loss", 0.0), (1, "loss", 1.0)]
    assert sum(len(chunk) for chunk in memory.chunks) == len(scope.frame())
    assert memory.summary.status == "finished"


def test_something_that_is_not_a_sink_is_rejected():
    with pytest.raises(TypeError, match="sinks"):
        layerscope.watch(nn.Linear(2, 2), sinks=[object()])
    with pytest.raises(TypeError, match="sinks"):
        layerscope.watch(nn.Linear(2, 2), sinks=3)


def test_a_failing_sink_warns_once_and_training_and_other_sinks_go_on():
    class Broken(Recording):
        def write(self, records):
            raise RuntimeError("sink is down")

    memory = MemorySink()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scope = _two_steps([Broken(), memory])
    ours = [w for w in caught if issubclass(w.category, LayerscopeWarning)]
    assert len(ours) == 1
    assert "sink is down" in str(ours[0].message)
    assert scope.failures >= 2
    assert len(scope.frame()) == 12  # the in-memory record is whole


def test_a_failing_sink_does_not_cost_the_sinks_after_it_their_rows():
    class Broken(Recording):
        def write(self, records):
            raise RuntimeError("sink is down")

    after = Recording()
    with pytest.warns(LayerscopeWarning, match="sink is down"):
        _two_steps([Broken(), after])
    writes = [call for call in after.calls if call[0] == "write"]
    assert sum(call[1] for call in writes) == 12
    assert after.calls[-1][0:2] == ("close", "finished")


def test_a_sink_failing_to_start_costs_a_warning_and_the_training_goes_on(tmp_path):
    class Unreachable(Recording):
        def start(self, info):
            raise ConnectionError("cannot reach the tracking server")

    started, after = Recording(), Recording()
    model = nn.Linear(3, 2)
    with pytest.warns(layerscope.LayerscopeWarning, match="starting the sink Unreachable failed"):
        scope = layerscope.watch(
            model, run=tmp_path / "run", every=1, sinks=[started, Unreachable(), after]
        )
    with scope:
        for _ in range(2):
            model(torch.ones(1, 3)).sum().backward()
            scope.step()
    meta = layerscope.load(tmp_path / "run").meta
    assert (meta["status"], meta["steps"], meta["failures"]) == ("finished", 2, 1)
    for sink in (started, after):  # the others get every row, and close as finished
        assert sink.calls[0][0] == "start"
        assert sink.calls[-1][0:2] == ("close", "finished")
        assert sum(call[1] for call in sink.calls if call[0] == "write") > 0


def test_a_store_failing_to_start_closes_the_sinks_started_and_raises(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text("{}")  # a run is there: never overwritten
    started = Recording()
    model = nn.Linear(3, 2)
    with pytest.raises(FileExistsError):
        layerscope.watch(model, run=tmp_path / "run", sinks=[started])
    assert [call[:2] for call in started.calls] == [("start", "run"), ("close", "failed")]
    assert not model._forward_hooks


@pytest.mark.parametrize("stage", ["write", "flush", "close"])
def test_a_sink_failing_later_costs_one_warning_and_the_run_is_whole(tmp_path, stage):
    class Failing(Recording):
        pass

    def fail(*args):
        raise ConnectionError(f"the tracking server went away at {stage}")

    failing, other = Failing(), Recording()
    setattr(failing, stage, fail)
    model = nn.Linear(3, 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with layerscope.watch(
            model, run=tmp_path / "run", every=1, sinks=[failing, other]
        ) as scope:
            for _ in range(3):
                model(torch.ones(1, 3)).sum().backward()
                scope.step()
    [warning] = [w for w in caught if issubclass(w.category, layerscope.LayerscopeWarning)]
    assert "the tracking server went away" in str(warning.message)
    run = layerscope.load(tmp_path / "run")
    assert (run.meta["status"], run.meta["steps"]) == ("finished", 3)
    assert sorted(set(run.stats["step"])) == [0, 1, 2]
    assert other.calls[-1][0:2] == ("close", "finished")
