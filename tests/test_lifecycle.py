"""Scopes at the interpreter's exit: closed, as failed when the script died, never hanging."""

import gc
import subprocess
import sys
import threading
import weakref

import pytest
import torch
from torch import nn

import layerscope


def _run_script(tmp_path, body):
    script = tmp_path / "script.py"
    script.write_text(
        "import torch, layerscope\n"
        "from torch import nn\n"
        "model = nn.Linear(3, 2)\n"
        f"scope = layerscope.watch(model, every=1, run={str(tmp_path / 'run')!r})\n"
        "model(torch.ones(1, 3)).sum().backward()\n"
        "scope.step()\n" + body
    )
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("body", "status"), [("", "finished"), ("raise SystemError('x')\n", "failed")]
)
def test_a_scope_left_open_is_closed_at_exit_as_the_script_ended(tmp_path, body, status):
    result = _run_script(tmp_path, body)
    assert (result.returncode == 0) == (status == "finished"), result.stderr
    run = layerscope.load(tmp_path / "run")
    assert run.meta["status"] == status
    assert len(run.stats) == 6  # the step recorded before the end is there


def test_an_open_scope_pins_neither_itself_nor_its_model():
    model = nn.Linear(3, 2)
    scope = layerscope.watch(model, every=1)
    scopes, models = weakref.ref(scope), weakref.ref(model)
    pipeline = scope._pipeline
    del scope, model
    gc.collect()
    assert scopes() is None
    assert models() is None
    pipeline.close(lambda *counts: layerscope.sinks._base.RunSummary("failed", 0.0, 0, 0, 0, 0))


def test_close_waits_for_a_hung_sink_only_as_long_as_asked():
    release = threading.Event()

    class Hung(layerscope.sinks.NullSink):
        def close(self, summary):
            release.wait(30)

    model = nn.Linear(3, 2)
    scope = layerscope.watch(model, every=1, sinks=[Hung()])
    model(torch.ones(1, 3)).sum().backward()
    scope.step()
    with pytest.warns(layerscope.LayerscopeWarning, match="did not finish the run in 0.2 s"):
        scope.close(timeout=0.2)
    assert not model._forward_hooks  # the hooks are off all the same
    release.set()


def test_a_watch_that_fails_making_its_hooks_stops_its_writer_and_leaves_no_run(
    tmp_path, monkeypatch
):
    from layerscope.scope import _lifecycle, _scope

    def fails(*args, **kwargs):
        raise RuntimeError("a hook could not be made")

    before = set(threading.enumerate())
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    with monkeypatch.context() as patch:
        patch.setattr(_scope, "NoiseScale", fails)
        with pytest.raises(RuntimeError, match="a hook could not be made"):
            layerscope.watch(model, run=tmp_path / "run")
    assert not (tmp_path / "run").exists()
    assert [t for t in threading.enumerate() if t not in before and t.is_alive()] == []
    assert not _lifecycle._open  # nothing left to close at exit
    with layerscope.watch(model, run=tmp_path / "run") as scope:  # the modules are free
        model(torch.ones(1, 3)).sum().backward()
        scope.step()
    assert len(layerscope.load(tmp_path / "run").stats) > 0
