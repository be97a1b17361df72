"""The README's quick start is what CI and the scripts run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parent.parent


def quick_start_commands():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Quick start") : readme.index("## Usage")]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]


def test_the_quick_start_is_two_commands_and_ci_runs_the_second():
    demo, test = quick_start_commands()
    assert (demo, test) == ("bash scripts/demo.sh", "bash scripts/test.sh")
    ci = (ROOT / ".ci" / "run").read_text()
    assert "exec bash scripts/test.sh" in ci


def test_the_demo_script_runs_the_demo_command():
    script = (ROOT / "scripts" / "demo.sh").read_text()
    assert "pip install -q torch==2.13.0" in script
    assert re.search(r"^\.venv/bin/layerscope demo\b", script, flags=re.M)
