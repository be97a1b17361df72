"""``capture(include=, exclude=)`` with callables and module objects, alone or mixed.

``Net``'s tree, and the names each case keeps, worked out by hand:

    ""             Net         root
    "body"         Sequential  a container
    "body.0"       Linear
    "body.1"       ReLU
    "body.2"       Linear
    "head"         Linear

By default the layers "body.0", "body.1", "body.2" and "head" are kept.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn

import layerscope


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def is_linear(name: str, module: nn.Module) -> bool:
    return isinstance(module, nn.Linear)


def kept(model: nn.Module, **selection: object) -> set[str]:
    """Modules whose outputs a capture kept over one forward pass."""
    with layerscope.capture(model, kinds=("activation",), **selection) as cap:  # type: ignore[arg-type]
        model(torch.randn(3, 4))
    return {record.module for record in cap.records}


def cases(model: Net) -> list[tuple[dict[str, object], set[str]]]:
    body, head = model.body, model.head
    return [
        ({"include": is_linear}, {"body.0", "body.2", "head"}),
        ({"include": lambda name, m: name == "body"}, {"body"}),  # a container, meant whole
        ({"include": head}, {"head"}),
        ({"include": [body[1], head]}, {"body.1", "head"}),
        ({"include": body}, {"body", "body.0", "body.1", "body.2"}),  # itself and its layers
        ({"include": [body, "^head$"], "exclude": is_linear}, {"body", "body.1"}),
        ({"include": [is_linear, body[1]], "exclude": head}, {"body.0", "body.1", "body.2"}),
        ({"exclude": body}, {"head"}),
        ({"exclude": [lambda name, m: name.endswith("2"), "1"]}, {"body.0", "head"}),
        ({"include": body, "types": (nn.Linear,)}, {"body.0", "body.2"}),
    ]


@pytest.mark.parametrize("case", range(10))
def test_each_form_keeps_the_modules_worked_out_by_hand(case: int) -> None:
    model = Net()
    selection, expected = cases(model)[case]
    assert kept(model, **selection) == expected


def test_module_objects_are_found_inside_wrappers() -> None:
    model = Net()
    parallel = nn.DataParallel(model)  # on the CPU: forward calls the model itself
    assert kept(parallel, include=[model.body[2]]) == {"body.2"}
    assert kept(parallel, include=parallel, exclude=[model.body]) == {"", "head"}


def test_callables_run_when_the_capture_starts_only() -> None:
    model = Net()
    asked: list[str] = []

    def counting(name: str, module: nn.Module) -> bool:
        asked.append(name)
        return name == "head"

    with layerscope.capture(model, include=counting, every=2) as cap:
        assert sorted(asked) == sorted(name for name, _ in model.named_modules())
        for _ in range(4):  # every=2 adds and removes hooks: no new selection
            model(torch.randn(3, 4)).sum().backward()
            cap.step()
    assert len(asked) == 6
    assert {record.module for record in cap.records} == {"head"}


@pytest.mark.parametrize(
    ("selection", "error", "message"),
    [
        ({"include": 3}, TypeError, r"^include: expected a regex string, .* a callable fn"),
        ({"exclude": nn.ReLU}, TypeError, r"^exclude: got the class ReLU; pass types="),
        ({"include": lambda module: True}, TypeError, r"^include: a callable is called as fn"),
        ({"include": nn.Linear(4, 2)}, ValueError, r"^include: the Linear module given is not"),
        ({"include": lambda name, m: 1 / 0}, ValueError, r"^include: <callable lambda> raised"),
    ],
)
def test_bad_items_get_errors_that_name_the_argument(selection, error, message) -> None:
    model = Net()
    with pytest.raises(error, match=message):
        layerscope.capture(model, **selection)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_a_copy_s_module_is_not_the_model_s() -> None:
    model = Net()
    with pytest.raises(ValueError, match=r"^exclude: the Linear module given is not part"):
        layerscope.capture(model, exclude=copy.deepcopy(model).head)


def test_the_saved_options_say_what_was_given(tmp_path) -> None:
    pytest.importorskip("safetensors")
    model = Net()
    with layerscope.capture(model, include=[model.body, is_linear], exclude="^head$") as cap:
        model(torch.randn(3, 4)).sum().backward()
    cap.save(tmp_path / "cap")
    options = layerscope.load_capture(tmp_path / "cap").info["options"]
    assert options["include"] == ["<module body>", "<callable is_linear>"]
    assert options["exclude"] == ["^head$"]


def test_a_run_s_tensors_take_module_objects_too(tmp_path) -> None:
    pytest.importorskip("safetensors")
    pytest.importorskip("duckdb")
    model = Net()
    tensors = {"include": [model.body[0], is_linear], "exclude": model.head, "kinds": "activation"}
    with layerscope.watch(model, run=tmp_path / "run", every=1, tensors=tensors) as scope:
        model(torch.randn(3, 4)).sum().backward()
        scope.step()
    run = layerscope.load(tmp_path / "run")
    assert {record.module for record in run.tensors.records} == {"body.0", "body.2"}
    saved = json.loads((tmp_path / "run" / "run.json").read_text())["config"]["tensors"]
    # tensors= is checked before the model is looked at: its modules are named by type
    assert saved["include"] == ["<module (a Linear)>", "<callable is_linear>"]
    assert saved["exclude"] == ["<module (a Linear)>"]


def tensor_tracker_picks(model: nn.Module, include: str) -> set[str]:
    """tensor_tracker's rule: ``re.search`` on every qualified name, root and containers too."""
    import re

    return {name for name, _ in model.named_modules() if re.search(include, name)}


@pytest.mark.parametrize(
    ("include", "differs"),
    [("body", set()), ("^body", set()), ("bod", {"body"}), (r"\d", set()), ("o", {"body"})],
)
def test_regexes_pick_what_tensor_tracker_picks_but_a_container_found_only_inside(
    include: str, differs: set[str]
) -> None:
    # The migrating guide's row: a container is picked where the regex matches its whole
    # name; where it is only found inside the name, its layers are (its output is theirs).
    model = Net()
    assert kept(model, include=include) == tensor_tracker_picks(model, include) - differs
