"""A run's whole tensors with a damaged part: that part left out and named, the others read.

Each case damages the second of three parts (one a kept step) of a real run; ``run.tensors``
and ``load_capture`` give the first and third parts' records, warn naming the second and why,
and ``run.skipped`` holds it. A guard fails the test instead of hanging on a FIFO.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import layerscope

safetensors_torch = pytest.importorskip("safetensors.torch")
pytest.importorskip("duckdb")

PART = "tensors/part-000002.safetensors"
GUARD_SECONDS = 30


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> Path:
    """A run that kept layer 0's activation at steps 0, 1 and 2: a part each."""
    path = tmp_path_factory.mktemp("parts") / "run"
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    tensors = {"include": "^0$", "kinds": "activation"}
    with layerscope.watch(model, run=path, every=1, alerts=False, tensors=tensors) as scope:
        for _ in range(3):
            model(torch.randn(2, 3)).sum().backward()
            scope.step()
    assert sorted(p.name for p in (path / "tensors").iterdir()) == [
        f"part-00000{number}.safetensors" for number in (1, 2, 3)
    ]
    return path


def _described(records: object) -> bytes:
    """A part whose one tensor is described by ``records`` (the header's JSON)."""
    values = {"000000": torch.ones(2)}
    payload: bytes = safetensors_torch.save(values, metadata={"records": json.dumps(records)})
    return payload


def _entry(**changes: object) -> dict:
    entry = {"module": "0", "type": "Linear", "kind": "activation", "tensor": "out",
             "step": 1, "phase": "train", "call": 0, "count": 1, "key": "000000"}  # fmt: skip
    return {**entry, **changes}


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _folder(path: Path) -> None:
    path.unlink()
    path.mkdir()


# case -> how the part is damaged, and words its reason holds.
DAMAGE = {
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]), "safetensors"),
    "garbage": (lambda p: p.write_bytes(b"not a safetensors file at all"), "safetensors"),
    "empty": (lambda p: p.write_bytes(b""), "safetensors"),
    "records-not-json": (
        lambda p: p.write_bytes(safetensors_torch.save({"a": torch.ones(1)}, {"records": "[{"})),
        "not JSON",
    ),
    "records-not-a-list": (lambda p: p.write_bytes(_described({"a": 1})), "not a list"),
    "step-a-string": (lambda p: p.write_bytes(_described([_entry(step="1")])), "step"),
    "call-a-bool": (lambda p: p.write_bytes(_described([_entry(call=True)])), "call"),
    "no-module": (lambda p: p.write_bytes(_described([_entry(module=None)])), "module"),
    "unknown-key": (lambda p: p.write_bytes(_described([_entry(key="999999")])), "key"),
    "fifo": (_fifo, "not a regular file"),
    "folder": (_folder, "a folder"),
}


@pytest.fixture
def damaged(original, tmp_path, request) -> Path:
    run = tmp_path / "run"
    shutil.copytree(original, run)
    damage, _ = DAMAGE[request.param]
    damage(run / PART)
    yield run
    if (run / PART).is_fifo():  # a reader still waiting on it is let go
        (run / PART).unlink()


def _guarded(read):
    """``read()``'s result and warnings, in a thread the test does not wait on forever."""
    outcome: dict = {}

    def target() -> None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                outcome["value"] = read()
            except Exception as error:  # the test names it
                outcome["error"] = error
        outcome["warnings"] = [str(warning.message) for warning in caught]

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(GUARD_SECONDS)
    assert not thread.is_alive(), "the reader blocked"
    assert "error" not in outcome, repr(outcome.get("error"))
    return outcome["value"], outcome["warnings"]


@pytest.mark.parametrize("damaged", list(DAMAGE), indirect=True)
def test_a_damaged_part_is_left_out_named_and_the_others_read(damaged, request):
    _, words = DAMAGE[request.node.callspec.params["damaged"]]
    run = layerscope.load(damaged)
    capture, warned = _guarded(lambda: run.tensors)
    assert [record.step for record in capture.records] == [0, 2]
    path = f"{damaged}/{PART}"
    assert words in run.skipped[path]
    assert [message for message in warned if path in message and words in message]
    loaded, _ = _guarded(lambda: layerscope.load_capture(damaged / "tensors"))
    assert [record.step for record in loaded.records] == [0, 2]
