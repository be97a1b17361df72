"""save() and load_capture() round-trip records exactly, without pickles."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import layerscope
from layerscope.tensors import _save

pytest.importorskip("safetensors")


def _assert_same(loaded, saved):
    assert len(loaded.records) == len(saved.records) > 0
    for a, b in zip(loaded.records, saved.records, strict=True):
        assert a.metadata() == b.metadata()
        assert a.value.dtype == b.value.dtype
        assert a.value.shape == b.value.shape
        assert torch.equal(a.value, b.value)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_round_trip_is_exact(tmp_path, dtype):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(inplace=True), nn.Linear(5, 2)).to(dtype)
    with layerscope.capture(model, kinds=("activation", "grad", "input")) as cap:
        for _ in range(3):
            model(torch.randn(4, 3, dtype=dtype)).sum().backward()
            cap.step()
        model.eval()
        with torch.no_grad():
            model(torch.randn(2, 3, dtype=dtype))
    cap.save(tmp_path / "cap")
    loaded = layerscope.load_capture(tmp_path / "cap")
    _assert_same(loaded, cap)
    assert {r.phase for r in loaded.records} == {"train", "eval"}
    assert {r.kind for r in loaded.records} == {"activation", "grad", "input"}
    assert loaded.info["options"]["kinds"] == ["activation", "grad", "input"]


def test_odd_values_round_trip(tmp_path):
    class Odd(nn.Module):
        def forward(self, x):
            return {
                "empty": x[:0],
                "scalar": x.sum(),
                "ints": x.argmax(dim=1),
                "mask": x > 0,
                "half": x.half().t(),
            }

    model = nn.Sequential(Odd())
    with layerscope.capture(model, include="^0$", kinds="activation") as cap:
        model(torch.randn(3, 4))
    cap.save(tmp_path / "odd")
    loaded = layerscope.load_capture(tmp_path / "odd")
    _assert_same(loaded, cap)
    assert [r.tensor for r in loaded.records] == [
        "out.empty",
        "out.scalar",
        "out.ints",
        "out.mask",
        "out.half",
    ]


def test_reduced_records_keep_their_count(tmp_path):
    model = nn.Linear(2, 2)
    with layerscope.capture(model, kinds="activation", reduction="mean") as cap:
        for _ in range(7):
            model(torch.randn(3, 2))
            cap.step()
    cap.save(tmp_path / "r")
    (record,) = layerscope.load_capture(tmp_path / "r").records
    assert record.count == 7
    assert record.step == 6
    assert torch.equal(record.value, cap.records[0].value)


def test_large_captures_are_split_across_files(tmp_path, monkeypatch):
    monkeypatch.setattr(_save, "SHARD_BYTES", 100)
    model = nn.Linear(4, 4)
    with layerscope.capture(model, kinds="activation") as cap:
        for _ in range(5):
            model(torch.randn(2, 4))  # 32 bytes each
            cap.step()
    cap.save(tmp_path / "s")
    index = json.loads((tmp_path / "s" / "capture.json").read_text())
    assert len(index["files"]) == 2
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == sorted(
        ["capture.json", *index["files"]]
    )
    _assert_same(layerscope.load_capture(tmp_path / "s"), cap)


def test_save_refuses_to_overwrite_unless_asked_and_then_leaves_no_old_file(tmp_path):
    model = nn.Linear(2, 2)
    with layerscope.capture(model, kinds="activation") as cap:
        model(torch.randn(1, 2))
    cap.save(tmp_path)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        cap.save(tmp_path)
    cap.clear()
    with layerscope.capture(model, kinds="activation") as second:
        model(torch.randn(1, 2))
        model(torch.randn(1, 2))
    second.save(tmp_path, overwrite=True)
    assert len(list(tmp_path.glob("*.safetensors"))) == 1
    _assert_same(layerscope.load_capture(tmp_path), second)


def test_a_loaded_capture_can_be_saved_again_and_framed(tmp_path):
    pytest.importorskip("pandas")
    model = nn.Linear(2, 2)
    with layerscope.capture(model) as cap:
        model(torch.randn(3, 2)).sum().backward()
    cap.save(tmp_path / "a")
    loaded = layerscope.load_capture(tmp_path / "a")
    loaded.save(tmp_path / "b")
    _assert_same(layerscope.load_capture(tmp_path / "b"), cap)
    assert loaded.to_frame().equals(cap.to_frame())


def test_load_capture_errors_name_the_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="no capture"):
        layerscope.load_capture(tmp_path)
    (tmp_path / "capture.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="not a layerscope capture"):
        layerscope.load_capture(tmp_path)
    index = {"format": "layerscope.capture", "version": 1, "files": ["../x.safetensors"]}
    (tmp_path / "capture.json").write_text(json.dumps({**index, "records": []}))
    with pytest.raises(ValueError, match="not a value file"):
        layerscope.load_capture(tmp_path)


def test_save_without_safetensors_says_what_to_install(tmp_path, monkeypatch):
    import sys

    model = nn.Linear(2, 2)
    with layerscope.capture(model) as cap:
        model(torch.randn(1, 2))
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    with pytest.raises(ImportError, match=r"pip install 'layerscope\[capture\]'"):
        cap.save(tmp_path)
