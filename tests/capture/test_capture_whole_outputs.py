"""``capture(whole_outputs=True)``: a module's output kept as it returned it (tensor_tracker)."""

from __future__ import annotations

import collections
import dataclasses
import json
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

import layerscope
from layerscope.tensors import Capture

pytest.importorskip("safetensors")


@dataclasses.dataclass
class Output:
    logits: Tensor
    hidden: tuple[Tensor, None]
    note: str


Pair = collections.namedtuple("Pair", ["first", "second"])


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lstm = nn.LSTM(3, 4, batch_first=True)  # returns (out, (h, c))
        self.fc = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Output:
        sequence, _ = self.lstm(x)
        logits = self.fc(sequence[:, -1])
        return Output(logits=logits, hidden=(logits * 2, None), note="kept")


def _x() -> Tensor:
    return torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(1))


def _capture(model: nn.Module, **options: object) -> Capture:
    with layerscope.capture(model, kinds=["activation"], **options) as cap:  # type: ignore[arg-type]
        model(_x())
    return cap


def test_an_output_is_kept_as_the_module_returned_it() -> None:
    model = Model()
    expected = model(_x())
    cap = _capture(model, include=["^$", "lstm"], whole_outputs=True)
    root, lstm = (next(r for r in cap.records if r.module == name) for name in ("", "lstm"))
    assert root.whole
    assert root.tensor == "out"
    assert isinstance(root.value, Output)
    assert root.value.note == "kept"
    assert root.value.hidden[1] is None
    assert torch.equal(root.value.logits, expected.logits)
    assert not root.value.logits.requires_grad  # a detached copy, not the live tensor
    assert root.value.logits.data_ptr() != expected.logits.data_ptr()
    out, (h, c) = lstm.value
    assert (out.shape, h.shape, c.shape) == ((2, 5, 4), (1, 2, 4), (1, 2, 4))


def test_the_frame_has_a_row_per_tensor_as_without_whole_outputs() -> None:
    model = Model()
    whole = _capture(model, include=["^$", "lstm"], whole_outputs=True).to_frame()
    split = _capture(model, include=["^$", "lstm"]).to_frame()
    columns = ["module", "kind", "tensor", "step", "call", "dtype", "shape", "std"]
    assert whole[columns].to_dict("records") == split[columns].to_dict("records")
    assert sorted(whole.tensor) == [
        "out.0",
        "out.1.0",
        "out.1.1",
        "out.hidden.0",
        "out.logits",
    ]


def test_a_saved_whole_output_loads_with_its_structure(tmp_path: Path) -> None:
    model = Model()
    cap = _capture(model, include=["^$", "lstm"], whole_outputs=True)
    cap.save(tmp_path / "cap")
    loaded = layerscope.load_capture(tmp_path / "cap")
    root = next(r for r in loaded.records if r.module == "")
    kept = next(r for r in cap.records if r.module == "")
    assert root.whole
    assert root.value.type_name.endswith("Output")
    assert root.value.note == "kept"
    assert root.value["hidden"][1] is None
    assert torch.equal(root.value.logits, kept.value.logits)
    assert torch.equal(root.value.hidden[0], kept.value.hidden[0])
    lstm = next(r for r in loaded.records if r.module == "lstm")
    assert isinstance(lstm.value, tuple)
    assert torch.equal(
        lstm.value[1][1], next(r for r in cap.records if r.module == "lstm").value[1][1]
    )
    assert loaded.to_frame()["std"].tolist() == cap.to_frame()["std"].tolist()


def test_a_namedtuple_loads_as_a_namedtuple_of_its_fields(tmp_path: Path) -> None:
    class Twin(nn.Module):
        def forward(self, x: Tensor) -> Pair:
            return Pair(first=x + 1, second=x * 2)

    model = nn.Sequential(Twin())
    cap = _capture(model, include="0", whole_outputs=True)
    cap.save(tmp_path / "cap")
    (record,) = layerscope.load_capture(tmp_path / "cap").records
    assert type(record.value).__name__ == "Pair"
    assert record.value._fields == ("first", "second")
    assert torch.equal(record.value.second, _x() * 2)


def test_a_hugging_face_model_output_keeps_its_class_and_saves_its_fields(tmp_path: Path) -> None:
    outputs = pytest.importorskip("transformers.modeling_outputs")

    class Encoder(nn.Module):
        def forward(self, x: Tensor) -> object:
            return outputs.BaseModelOutput(last_hidden_state=x * 3, hidden_states=(x, x + 1))

    model = nn.Sequential(Encoder())
    cap = _capture(model, include="0", whole_outputs=True)
    (record,) = cap.records
    assert isinstance(record.value, outputs.BaseModelOutput)
    assert torch.equal(record.value.last_hidden_state, _x() * 3)
    cap.save(tmp_path / "cap")
    (loaded,) = layerscope.load_capture(tmp_path / "cap").records
    assert loaded.value.type_name == "transformers.modeling_outputs.BaseModelOutput"
    assert torch.equal(loaded.value.hidden_states[1], _x() + 1)
    assert sorted(cap.to_frame().tensor) == [
        "out.hidden_states.0",
        "out.hidden_states.1",
        "out.last_hidden_state",
    ]


def test_stash_value_applies_to_each_tensor_inside() -> None:
    model = Model()
    cap = _capture(model, include="^$", whole_outputs=True, stash_value=lambda t: t[:1])
    (record,) = cap.records
    assert record.value.logits.shape == (1, 2)
    assert record.value.note == "kept"


def test_gradients_stay_a_record_per_tensor() -> None:
    model = Model()
    with layerscope.capture(
        model, include="fc", kinds=["activation", "grad"], whole_outputs=True
    ) as cap:
        model(_x()).logits.sum().backward()
    assert [(r.kind, r.tensor, r.whole) for r in cap.records] == [
        ("activation", "out", True),
        ("grad", "out", False),
    ]


def test_bad_whole_outputs_arguments_say_what_was_expected() -> None:
    with pytest.raises(TypeError, match="whole_outputs: expected True or False"):
        layerscope.capture(Model(), whole_outputs="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="whole_outputs, reduction"):
        layerscope.capture(Model(), whole_outputs=True, reduction="sum")


@pytest.mark.parametrize(
    "damage",
    [
        {"namedtuple": {"type": "class", "fields": []}},  # fields not a mapping
        {"object": {"fields": {}}},  # no type
        {"namedtuple": {"type": "Pair", "fields": {"first": {"file": 9, "key": "x"}}}},
    ],
)
def test_a_damaged_structure_is_that_records_clear_error(tmp_path: Path, damage: dict) -> None:
    model = Model()
    cap = _capture(model, include="^$", whole_outputs=True)
    cap.save(tmp_path / "cap")
    index_path = tmp_path / "cap" / "capture.json"
    index = json.loads(index_path.read_text())
    index["records"][0]["value"] = damage
    index_path.write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"record 0 of .* is damaged"):
        layerscope.load_capture(tmp_path / "cap")


def test_a_keyword_or_odd_type_name_still_loads(tmp_path: Path) -> None:
    cap = _capture(nn.Sequential(nn.Identity()), include="0", whole_outputs=True)
    cap.save(tmp_path / "cap")
    index_path = tmp_path / "cap" / "capture.json"
    index = json.loads(index_path.read_text())
    tensor_ref = index["records"][0].pop("file"), index["records"][0].pop("key")
    reference = {"file": tensor_ref[0], "key": tensor_ref[1]}
    index["records"][0]["value"] = {"namedtuple": {"type": "class", "fields": {"def": reference}}}
    index["version"] = 3
    index_path.write_text(json.dumps(index))
    (record,) = layerscope.load_capture(tmp_path / "cap").records
    assert type(record.value).__name__ == "SavedTuple"
    assert torch.equal(record.value[0], _x())
