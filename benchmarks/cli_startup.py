"""How fast the ``layerscope`` command answers on the demo's runs, and whether it imports torch.

    python benchmarks/cli_startup.py                    # runs the demo into a temporary folder
    python benchmarks/cli_startup.py --demo DIR         # an existing ``layerscope demo --out DIR``
    python benchmarks/cli_startup.py --repeat 9

Each command runs in a fresh interpreter (``python -m layerscope ...``, ``--plain``), as a
user's shell runs it; the figure is the median wall time of ``--repeat`` runs after one
warm-up (the files are then in the page cache, as they are for a user who just trained).
Under ``PYTHONPATH=<another checkout>/src`` it measures that checkout instead.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_TORCH = "import sys; print('torch' in sys.modules)"


def demo_runs(folder: Path) -> list[Path]:
    """The demo's two runs under ``folder``, written first if it holds none."""
    runs = sorted(path.parent for path in folder.glob("*/run.json"))
    if not runs:
        command = [sys.executable, "-m", "layerscope", "demo", "--out", str(folder), "--plain"]
        subprocess.run(command, check=True, capture_output=True)
        runs = sorted(path.parent for path in folder.glob("*/run.json"))
    return runs


def seconds(argv: list[str], repeat: int) -> float:
    """The median wall time of ``argv`` in a fresh interpreter, after one warm-up."""
    times = []
    for attempt in range(repeat + 1):
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        if attempt:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def imports_torch(code: str) -> bool:
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\n{_TORCH}"], check=True, capture_output=True, text=True
    )
    return done.stdout.split()[-1] == "True"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo", type=Path, help="a folder the demo wrote (default: run it now)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.demo or Path(scratch) / "demo"
        broken, fixed = demo_runs(folder)
        command = [sys.executable, "-m", "layerscope"]
        cases = {
            "import layerscope.cli": [sys.executable, "-c", "import layerscope.cli"],
            "layerscope runs DEMO": [*command, "runs", str(folder), "--plain"],
            "layerscope summary RUN": [*command, "summary", str(broken), "--plain"],
            "layerscope diff RUN RUN": [*command, "diff", str(broken), str(fixed), "--plain"],
            "python -c 'import torch'": [sys.executable, "-c", "import torch"],
        }
        print(f"{'command':<28} {'median':>8}")
        for name, argv in cases.items():
            print(f"{name:<28} {seconds(argv, args.repeat):>7.2f}s")
        summary = (
            "from layerscope.cli import main; import contextlib, io\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    main(['summary', {str(broken)!r}, '--plain'])"
        )
        print(f"summary imports torch: {imports_torch(summary)}")


if __name__ == "__main__":
    main()
