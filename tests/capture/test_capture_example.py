"""examples/capture.py runs as it is, and what it saved reads back."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import layerscope

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "capture.py"


def test_the_capture_example_saves_what_it_captured(tmp_path):
    pytest.importorskip("safetensors")
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--out", str(tmp_path / "saved"), "--steps", "30"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "kept 6 tensors, 49152 bytes" in out  # steps 0, 10, 20: output and gradient
    assert re.search(r"mean ReLU output over 30 steps: \d+ of 32 units dead", out)
    assert "loaded back: 6 records, same=True" in out
    loaded = layerscope.load_capture(tmp_path / "saved")
    assert [(r.step, r.kind) for r in loaded.records] == [
        (step, kind) for step in (0, 10, 20) for kind in ("activation", "grad")
    ]
    assert all(r.value.shape == torch.Size([64, 32]) for r in loaded.records)
