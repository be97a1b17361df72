"""The wheel, not the checkout: ``pip wheel .`` builds the C kernel into it, and the wheel,
installed into a fresh virtualenv on a machine with no compiler, computes with it; built with
no compiler, the wheel still installs and the torch kernels answer, with one warning.

The fresh virtualenvs reuse this one's packages (torch, numpy) through a .pth file; layerscope
itself comes from the wheel, and the checkout is not on their path.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from layerscope.stats import _native
from tests.bare_venvs import bare_venv

ROOT = Path(__file__).parent.parent
COMPILERS = ("cc", "gcc", "clang", "c++", "g++", "clang++")

pytestmark = pytest.mark.slow

# Run in the fresh virtualenv with no compiler: which layerscope and kernel answer, and how
# their statistics compare with float64 numpy.
_CHECK = """
import json, math, sys, warnings
import numpy as np
import torch
import layerscope
from layerscope.stats import LOG2_BINS, Field, Log2Histogram, _native, _partials, tensor_partials

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    rng = np.random.default_rng(0)
    a = rng.standard_normal(300_017) * 10.0 ** rng.integers(-20, 20, 300_017)
    a[rng.random(a.size) < 0.01] = math.nan
    a[:3] = [math.inf, -math.inf, 0.0]
    mismatches = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for threads in (1, 2):
            torch.set_num_threads(threads)
            x = torch.from_numpy(a).to(dtype)
            row, hist = tensor_partials(x, Log2Histogram())
            v = x.double().numpy()
            finite = v[np.isfinite(v)]
            exponent = np.frexp(np.abs(finite))[1]
            bins = np.where(np.abs(finite) < 2.0**-126, 0, np.clip(exponent + 126, 1, 254))
            want_hist = np.bincount(bins, minlength=LOG2_BINS)
            want_hist[255] = v.size - finite.size
            want = {
                Field.COUNT: finite.size, Field.MIN: finite.min(), Field.MAX: finite.max(),
                Field.NAN: np.isnan(v).sum(), Field.INF: np.isinf(v).sum(),
                Field.ZEROS: (v == 0).sum(), Field.NEG: (v < 0).sum(), Field.POS: (v > 0).sum(),
            }
            for field, value in want.items():
                if row[field].item() != value:
                    mismatches.append((str(dtype), threads, field.name, row[field].item(), value))
            if not np.array_equal(hist.numpy(), want_hist):
                mismatches.append((str(dtype), threads, "hist"))
            mean = finite.mean()
            m2 = ((finite - mean) ** 2).sum()
            scale = np.abs(finite).max()
            got_mean, got_m2 = row[Field.MEAN].item(), row[Field.M2].item()
            if not math.isclose(got_mean, mean, rel_tol=1e-9, abs_tol=1e-9 * scale):
                mismatches.append((str(dtype), threads, "mean", got_mean, mean))
            if not math.isclose(got_m2, m2, rel_tol=1e-9):
                mismatches.append((str(dtype), threads, "M2", got_m2, m2))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    with layerscope.watch(model, every=1, run="run") as scope:
        model(torch.randn(4, 8)).sum().backward()
        scope.step()
library = _native.library()
print(json.dumps({
    "run_kernel": json.load(open("run/run.json"))["kernel"],
    "layerscope": layerscope.__file__,
    "library": None if library is None else library._name,
    "kernel": _partials.kernel_name("cpu"),
    "mismatches": [[str(part) for part in m] for m in mismatches],
    "warnings": [
        str(w.message) for w in caught if issubclass(w.category, layerscope.LayerscopeWarning)
    ],
}))
"""


def _checkout_copy(tmp_path: Path) -> Path:
    """The files ``pip wheel`` reads, copied: no build folders or in-place library of ours."""
    copy = tmp_path / "checkout"
    copy.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, copy / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info")
    shutil.copytree(ROOT / "src", copy / "src", ignore=ignore)
    return copy


def _no_compiler(tmp_path: Path) -> dict[str, str]:
    """An environment whose compilers fail and note that they were called."""
    fake = tmp_path / "no-compiler"
    fake.mkdir(exist_ok=True)
    for name in COMPILERS:
        script = fake / name
        script.write_text(f'#!/bin/sh\necho "$0" >> "{tmp_path / "compiler-calls"}"\nexit 1\n')
        script.chmod(0o755)
    env = {key: value for key, value in os.environ.items() if not key.startswith("LAYERSCOPE_")}
    env.update(
        PATH=os.pathsep.join([str(fake), str(Path(sys.executable).parent), "/usr/bin", "/bin"]),
        CC="/bin/false",
        CXX="/bin/false",
        LAYERSCOPE_CACHE=str(tmp_path / "cache"),
        LAYERSCOPE_COMPILE="0",  # the torch fallback's compiler needs a C++ compiler too
    )
    return env


def _build_wheel(tmp_path: Path, env: dict[str, str] | None = None) -> Path:
    checkout = _checkout_copy(tmp_path)
    dist = tmp_path / "dist"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(checkout), "--no-deps", "-w", str(dist)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [wheel] = dist.glob("layerscope-*.whl")
    return wheel


def _fresh_venv(tmp_path: Path, wheel: Path) -> Path:
    """A virtualenv with the wheel installed and this one's other packages on its path."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # after its own site-packages: torch and numpy from here, layerscope from the wheel
    Path(site, "outer-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "-q", str(wheel)],
        check=True,
    )  # fmt: skip
    return python


def _check(tmp_path: Path, python: Path) -> dict[str, object]:
    done = subprocess.run(
        [str(python), "-c", _CHECK],
        capture_output=True,
        text=True,
        env=_no_compiler(tmp_path),
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    assert str(report["layerscope"]).startswith(str(tmp_path / "venv"))
    assert report["mismatches"] == []
    assert report["run_kernel"] == report["kernel"]  # run.json says which kernel ran
    assert not (tmp_path / "compiler-calls").exists()  # nothing compiled at run time
    assert not (tmp_path / "cache").exists()
    return report


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel ``pip wheel .`` builds from a copy of the checkout, with a compiler."""
    return _build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.mark.skipif(_native.kernel_name() is None, reason="no C kernel built here to compare")
def test_the_wheel_carries_the_kernel_and_uses_it_with_no_compiler(tmp_path, wheel):
    assert "-py3-none-" in wheel.name  # C with no Python ABI: one wheel per platform
    assert "any" not in wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    assert "layerscope/stats/libnative.so" in names
    library = zipfile.ZipFile(wheel).read("layerscope/stats/libnative.so")
    assert b"libgomp" not in library  # torch's OpenMP runtime, not one of its own
    report = _check(tmp_path, _fresh_venv(tmp_path, wheel))
    assert report["library"] == str(
        Path(str(report["layerscope"])).parent / "stats" / "libnative.so"
    )
    assert report["kernel"] == _native.kernel_name()  # the best copy for this CPU
    assert report["warnings"] == []


def test_a_wheel_built_with_no_compiler_installs_and_the_torch_kernels_answer(tmp_path):
    wheel = _build_wheel(tmp_path, env=_no_compiler(tmp_path))
    (tmp_path / "compiler-calls").unlink(missing_ok=True)  # the build tried them: fine
    assert "layerscope/stats/libnative.so" not in zipfile.ZipFile(wheel).namelist()
    report = _check(tmp_path, _fresh_venv(tmp_path, wheel))
    assert report["library"] is None
    assert report["kernel"] == "eager"
    [warning] = report["warnings"]
    assert "not built when layerscope was installed" in warning


# Each extra's feature, in a virtualenv that holds torch, that extra's requirements and the
# wheel alone: training watched in memory, then what the extra is for.
_TRAIN = """
import sys, torch, layerscope
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
run = sys.argv[1] if len(sys.argv) > 1 else None
with layerscope.watch(model, optimizer=optimizer, every=1, run=run) as scope:
    for _ in range(3):
        loss = model(torch.randn(16, 4)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scope.step(loss=loss)
"""
_FEATURES = {
    "": _TRAIN
    + """
import importlib.util
assert importlib.util.find_spec("numpy") is None and "numpy" not in sys.modules
try:
    scope.frame()
except ImportError as error:
    print(error)
""",
    "dataframe": _TRAIN
    + """
stored = layerscope.load(run)
print(len(stored.stats), stored.sql("select count(*) as n from stats"))
""",
    "plot": _TRAIN
    + """
import matplotlib
matplotlib.use("Agg")
layerscope.load(run).plot.stats(kind="activation").savefig("stats.png")
print(open("stats.png", "rb").read(4))
""",
    "capture": """
import torch, layerscope
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
with layerscope.capture(model, every=1) as cap:
    model(torch.randn(2, 4))
cap.save("captures")
print(len(layerscope.load_capture("captures")))
""",
    "tensorboard": _TRAIN.replace(
        "run=run)", "run=run, sinks=[layerscope.sinks.TensorBoard('tb')])"
    ).replace("import sys, torch, layerscope", "import sys, torch, layerscope, layerscope.sinks")
    + """
import os
print(sorted(os.listdir("tb"))[0][:20])
""",
    "mlflow": _TRAIN.replace(
        "run=run)", "run=run, sinks=[layerscope.sinks.MLflow(experiment='exp')])"
    ).replace("import sys, torch, layerscope", "import sys, torch, layerscope, layerscope.sinks")
    + """
assert scope.failures == 0  # the sink started, wrote and closed on MLflow's default store
import mlflow
print(len(mlflow.search_runs(experiment_names=["exp"])))
""",
    "wandb": _TRAIN.replace(
        "run=run)", "run=run, sinks=[layerscope.sinks.WandB(project='exp')])"
    ).replace("import sys, torch, layerscope", "import sys, torch, layerscope, layerscope.sinks")
    + """
assert scope.failures == 0
""",
    "cli": _TRAIN,  # then the command below
    "ui": _TRAIN,
    "transformers": """
from transformers import TrainingArguments
from layerscope.integrations.transformers import LayerscopeCallback
TrainingArguments(output_dir="out", report_to=[])
print(LayerscopeCallback.__name__)
""",
}

# The command each extra's console feature runs after training.
_COMMANDS = {"cli": ["summary", "run"], "ui": ["report", "run", "-o", "run.html"]}


@pytest.mark.parametrize("extra", list(_FEATURES), ids=lambda extra: extra or "torch-only")
def test_each_extra_alone_brings_what_its_feature_imports(tmp_path, wheel, extra):
    python = bare_venv(tmp_path / "venv", wheel, extra)
    argv = [str(python), "-c", _FEATURES[extra]]
    if extra not in ("", "capture", "tensorboard", "transformers", "mlflow", "wandb"):
        argv.append("run")  # the others write no run
    environment = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    environment.pop("MLFLOW_TRACKING_URI", None)  # MLflow's default store
    done = subprocess.run(
        argv, capture_output=True, text=True, cwd=tmp_path, timeout=300, env=environment
    )
    assert done.returncode == 0, done.stderr[-3000:]
    if extra in _COMMANDS:
        command = [str(python.parent / "layerscope"), *_COMMANDS[extra]]
        done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    if extra == "":  # no pandas: the error says which extra brings it
        assert "layerscope[dataframe]" in done.stdout
