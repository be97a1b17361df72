"""BENCHMARKS.md: each benchmark script owns one section and replaces only that."""

from __future__ import annotations

import re
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
