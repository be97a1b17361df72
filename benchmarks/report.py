"""BENCHMARKS.md: each benchmark script owns one section and replaces only that."""

from __future__ import annotations

import platform
import re
import sys
from pathlib import Path

PATH = Path(__file__).parent.parent / "BENCHMARKS.md"


def replace_section(title: str, body: str) -> None:
    """Put ``## title`` with ``body`` in BENCHMARKS.md, replacing that section if present."""
    current = PATH.read_text() if PATH.exists() else "# Benchmarks\n"
    pattern = rf"## {re.escape(title)}\n.*?(?=\n## |\Z)"
    section = f"## {title}\n\n{body.strip()}\n"
    if re.search(pattern, current, flags=re.S):
        current = re.sub(pattern, lambda _: section, current, flags=re.S)
    else:
        current = current.rstrip() + "\n\n" + section
    PATH.write_text(current.rstrip() + "\n")


def machine(threads: int) -> str:
    """The machine and versions a section's figures were taken with."""
    import torch

    import layerscope

    return (
        f"{platform.machine()}, {threads} threads, Python {platform.python_version()}, "
        f"torch {torch.__version__}, layerscope {layerscope.__version__}"
    )


def command(script: str) -> str:
    """The command line that made a section, as typed: ``python benchmarks/<script> ...``."""
    return f"python benchmarks/{script} {' '.join(sys.argv[1:])}".strip()
