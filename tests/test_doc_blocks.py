"""Every Python block written into a docs page runs as written: alone, in a fresh folder.

A reader copies a block into a file or a notebook cell and runs it: it must define what it
uses. Blocks that include a snippet file (``--8<--``) are the files' own, run and compared
with the output the page shows by ``test_docs.py``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def inline_blocks() -> dict[str, str]:
    """Each page's Python blocks written there, by ``page:line``."""
    found = {}
    for page in sorted((ROOT / "docs").rglob("*.md")):
        text = page.read_text()
        for match in _BLOCK.finditer(text):
            code = match.group(1)
            if code.lstrip().startswith("--8<--"):
                continue
            line = text.count("\n", 0, match.start()) + 1
            found[f"{page.relative_to(ROOT)}:{line}"] = code
    return found


BLOCKS = inline_blocks()


def test_the_pages_have_inline_blocks_to_run():
    assert len(BLOCKS) >= 5  # the parsing finds them


@pytest.mark.slow
@pytest.mark.parametrize("where", list(BLOCKS))
def test_an_inline_block_runs_as_written(tmp_path: Path, where: str) -> None:
    script = tmp_path / "block.py"
    script.write_text(BLOCKS[where])
    environment = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
    }
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
    )
    assert result.returncode == 0, f"{where}:\n{result.stderr[-3000:]}"
