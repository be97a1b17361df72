"""The C kernel's library: what setup.py built, and the fallbacks where there is none.

Each fallback runs in a fresh process, told where its library is (a missing path stands for an
install with no compiler) and which compiler it has, and reports what it used and warned.
Building a wheel and using it with no compiler around is tests/test_wheel.py.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from layerscope.stats import _native, _native_build

COMPILER = shutil.which("cc") or shutil.which("gcc")

# argv: the library to load ("-": the installed one), the compile timeout ("-": the default),
# the run directory.
_PROBE = """
import json, sys, warnings
from pathlib import Path
import torch
from torch import nn
from layerscope.stats import _native, _native_build
if sys.argv[1] != "-":
    _native.LIBRARY = Path(sys.argv[1])
if sys.argv[2] != "-":
    _native_build._COMPILE_TIMEOUT = float(sys.argv[2])
import layerscope
from layerscope.stats import Log2Histogram, _partials, tensor_partials

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    with layerscope.watch(model, every=1, run=Path(sys.argv[3]) / "run") as scope:
        for step in range(3):
            loss = model(torch.randn(8, 16)).pow(2).mean()
            loss.backward()
            scope.step(loss=loss)
    row, hist = tensor_partials(torch.tensor([1.0, -2.0, float("nan"), 0.0]), Log2Histogram())
library = _native.library()
print(json.dumps({
    "kernel": _partials.kernel_name("cpu"),
    "library": None if library is None else library._name,
    "warnings": [
        str(w.message) for w in caught if issubclass(w.category, layerscope.LayerscopeWarning)
    ],
    "row": [round(v, 12) for v in row.tolist()],
    "hist": hist[[0, 127, 128, 255]].tolist(),
    "run_kernel": json.loads((Path(sys.argv[3]) / "run" / "run.json").read_text())["kernel"],
}))
"""
# numel, count, mean, M2, min, max, zeros, nan, inf, neg, pos; then 4 histogram slots
# [1, -2, nan, 0]: every low-precision format holds it (the last 8 fields).
_ROW = [4.0, 3.0, -0.333333333333, 4.666666666667, -2.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, *[0.0] * 8]
_HIST = [1, 1, 1, 1]


def _probe(
    tmp_path: Path, library: str = "-", timeout: str = "-", **environment: str
) -> dict[str, object]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("LAYERSCOPE_")}
    env.update(LAYERSCOPE_COMPILE="0", LAYERSCOPE_CACHE=str(tmp_path / "cache"), **environment)
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, library, timeout, tempfile.mkdtemp(dir=tmp_path)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["row"] == _ROW
    assert report["hist"] == _HIST
    assert report["run_kernel"] == report["kernel"]  # run.json names the kernel
    return report


def _counting_compiler(tmp_path: Path, delay: float = 0.0) -> tuple[Path, Path]:
    """A compiler that notes each run in a log, after ``delay`` seconds, then compiles."""
    if COMPILER is None:
        pytest.skip("no C compiler here")
    log = tmp_path / "compiler-runs"
    script = tmp_path / "counting-cc"
    script.write_text(f'#!/bin/sh\necho run >> "{log}"\nsleep {delay}\nexec "{COMPILER}" "$@"\n')
    script.chmod(0o755)
    return script, log


def _runs(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.mark.skipif(not _native.LIBRARY.exists(), reason="the kernel was not built here")
def test_the_installed_library_links_no_openmp_runtime_and_holds_every_copy():
    data = _native.LIBRARY.read_bytes()
    for runtime in (b"libgomp", b"libomp", b"libiomp", b"GOMP_parallel"):
        assert runtime not in data
    copies = [b"portable\0"]
    if platform.machine() in ("x86_64", "AMD64"):  # whatever this CPU has: not -march=native
        copies += [b"avx2\0", b"avx512\0"]
    for copy in copies:
        assert copy in data


def test_a_missing_library_warns_once_at_the_first_recorded_step_and_torch_answers(tmp_path):
    report = _probe(tmp_path, library=str(tmp_path / "missing.so"))
    assert report["library"] is None
    assert report["kernel"] == "eager"
    [warning] = report["warnings"]
    assert "not built when layerscope was installed" in warning
    assert "eager torch kernel" in warning
    assert "LAYERSCOPE_BUILD_NATIVE=1" in warning
    assert not (tmp_path / "cache").exists()  # nothing built, nothing cached


def test_layerscope_native_0_turns_it_off_silently(tmp_path):
    report = _probe(tmp_path, LAYERSCOPE_NATIVE="0")
    assert report["library"] is None
    assert report["kernel"] == "eager"
    assert report["warnings"] == []


@pytest.mark.skipif(not _native.LIBRARY.exists(), reason="the kernel was not built here")
def test_the_installed_library_is_used_and_nothing_is_built(tmp_path):
    compiler, log = _counting_compiler(tmp_path)
    report = _probe(tmp_path, CC=str(compiler), LAYERSCOPE_BUILD_NATIVE="1")
    assert report["library"] == str(_native.LIBRARY)
    assert str(report["kernel"]).startswith("native")
    assert report["warnings"] == []
    assert _runs(log) == 0


def test_build_native_1_builds_once_into_a_private_cache_and_loads_from_it_after(tmp_path):
    compiler, log = _counting_compiler(tmp_path)
    missing = str(tmp_path / "missing.so")
    for _ in range(2):
        report = _probe(tmp_path, missing, CC=str(compiler), LAYERSCOPE_BUILD_NATIVE="1")
        assert report["warnings"] == []
        assert report["kernel"] == _native.kernel_name()
    assert _runs(log) == 1  # the second process loaded what the first built
    cache = tmp_path / "cache"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700 & ~_umask()
    [built] = cache.glob("*.so")
    assert report["library"] == str(built)
    assert sorted(path.name for path in cache.iterdir()) == sorted([built.name, "build.lock"])


def test_processes_building_at_once_build_once(tmp_path):
    # torchrun's ranks all start at once: one builds, the others wait for it.
    compiler, log = _counting_compiler(tmp_path, delay=1.0)
    env = {key: value for key, value in os.environ.items() if not key.startswith("LAYERSCOPE_")}
    env.update(
        LAYERSCOPE_COMPILE="0",
        LAYERSCOPE_CACHE=str(tmp_path / "cache"),
        LAYERSCOPE_BUILD_NATIVE="1",
        CC=str(compiler),
    )
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", _PROBE, str(tmp_path / "missing.so"), "-", str(tmp_path / n)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for n in "ab"
    ]
    reports = [json.loads(rank.communicate()[0].strip().splitlines()[-1]) for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0]
    assert _runs(log) == 1
    assert all(report["kernel"] == _native.kernel_name() for report in reports)
    assert reports[0]["library"] == reports[1]["library"]


def test_a_cache_others_can_write_to_is_not_used(tmp_path):
    # A library in a folder others can write to could be replaced under us: build into a
    # private temporary folder instead, each process.
    compiler, log = _counting_compiler(tmp_path)
    shared = tmp_path / "cache"
    shared.mkdir()
    shared.chmod(0o777)
    report = _probe(
        tmp_path, str(tmp_path / "missing.so"), CC=str(compiler), LAYERSCOPE_BUILD_NATIVE="1"
    )
    assert report["kernel"] == _native.kernel_name()
    assert report["warnings"] == []
    assert not str(report["library"]).startswith(str(shared))
    assert list(shared.iterdir()) == []
    assert _runs(log) == 1


def test_a_cached_library_that_does_not_load_is_not_built_again(tmp_path):
    # A cache on a noexec mount, for one: each start would otherwise build again, in vain.
    compiler, log = _counting_compiler(tmp_path)
    missing = str(tmp_path / "missing.so")
    _probe(tmp_path, missing, CC=str(compiler), LAYERSCOPE_BUILD_NATIVE="1")
    [built] = (tmp_path / "cache").glob("*.so")
    built.write_bytes(b"not a library")
    for _ in range(2):
        report = _probe(tmp_path, missing, CC=str(compiler), LAYERSCOPE_BUILD_NATIVE="1")
        assert report["kernel"] == "eager"
        [warning] = report["warnings"]
        assert "building it with LAYERSCOPE_BUILD_NATIVE=1 failed" in warning
        assert str(built) in warning
    assert _runs(log) == 1


def test_a_hanging_compiler_is_given_up_on(tmp_path):
    hanging = tmp_path / "hanging-cc"
    hanging.write_text("#!/bin/sh\nexec sleep 60\n")
    hanging.chmod(0o755)
    start = time.monotonic()
    report = _probe(
        tmp_path, str(tmp_path / "missing.so"), "1", CC=str(hanging), LAYERSCOPE_BUILD_NATIVE="1"
    )
    assert time.monotonic() - start < 30
    assert report["kernel"] == "eager"
    [warning] = report["warnings"]
    assert "timed out" in warning


def test_a_failing_compiler_warns_once(tmp_path):
    report = _probe(tmp_path, str(tmp_path / "missing.so"), CC="false", LAYERSCOPE_BUILD_NATIVE="1")
    assert report["kernel"] == "eager"
    [warning] = report["warnings"]
    assert "building it with LAYERSCOPE_BUILD_NATIVE=1 failed" in warning


@pytest.mark.skipif(COMPILER is None, reason="no C compiler here")
def test_a_library_built_from_another_source_is_refused(tmp_path):
    # pip install -e builds in place; an edit of _native.c afterwards must not go unnoticed.
    built = tmp_path / "libnative.so"
    subprocess.run(
        [COMPILER, *_native_build._FLAGS, '-DLAYERSCOPE_SOURCE_ID="0123"',
         str(_native.SOURCE), "-o", str(built), "-lm"],
        check=True,
    )  # fmt: skip
    with pytest.raises(RuntimeError, match=r"another _native\.c"):
        _native._open(built)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
