"""Reading a run needs no torch: the command imports it only for the commands that train.

Each check runs a fresh interpreter, since this one imported torch long ago, and reads
``sys.modules`` there: what was imported, not how long it took (timings are the benchmark's,
``benchmarks/cli_startup.py``).
"""

import json
import subprocess
import sys

import pytest

_REPORT = "import json, sys; print(json.dumps(sorted(m for m in sys.modules if m == 'torch')))"


def _imported_torch(code: str) -> bool:
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\n{_REPORT}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1]) == ["torch"]


def test_importing_the_package_or_its_command_imports_no_torch():
    assert not _imported_torch("import layerscope, layerscope.cli")
    assert not _imported_torch("import layerscope.store, layerscope.model, layerscope.stats")


def test_the_public_names_import_torch_when_used():
    assert _imported_torch("import layerscope; layerscope.watch")
    assert _imported_torch("from layerscope import Scope")
    assert _imported_torch("from layerscope.stats import finalize")


@pytest.mark.parametrize("command", [["runs", "{root}"], ["summary", "{run}"]])
def test_reading_a_run_imports_no_torch(run_dir, command):
    argv = [part.format(root=run_dir.parent, run=run_dir) for part in command]
    code = (
        "import contextlib, io\n"
        "from layerscope.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        f"    status = main({[*argv, '--plain']!r})\n"
        "assert status == 0 and str(out.getvalue()).strip(), out.getvalue()"
    )
    assert not _imported_torch(code)


def test_the_public_face_lists_what_it_gives():
    import layerscope

    assert set(layerscope.__all__) <= set(dir(layerscope))
    for name in layerscope.__all__:
        assert getattr(layerscope, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        layerscope.nothing  # noqa: B018
