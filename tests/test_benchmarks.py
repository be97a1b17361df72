"""The benchmark scripts still import against the package they measure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"


def test_every_benchmark_script_imports():
    names = sorted(path.stem for path in BENCHMARKS.glob("*.py"))
    assert {"overhead", "memory", "store", "kernel", "compile"} <= set(names)
    code = f"import sys; sys.path.insert(0, {str(BENCHMARKS)!r})\n" + "".join(
        f"import {name}\n" for name in names
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
