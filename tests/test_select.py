"""``watch(include=, exclude=)`` with callables and module objects, alone or mixed with regexes.

Each expectation is the set of names worked out by hand from ``Net``'s tree below:

    ""                 Net         root
    "encoder"          Sequential  a container
    "encoder.0"        Block       no parameters of its own, has children
    "encoder.0.fc"     Linear
    "encoder.0.act"    ReLU
    "encoder.1"        Block
    "encoder.1.fc"     Linear
    "encoder.1.act"    ReLU
    "head"             Linear

By default the five layers are watched: the two ``fc``, the two ``act`` and ``head``.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import layerscope
from layerscope.cli import main

SNIPPET = Path(__file__).resolve().parents[1] / "docs" / "snippets" / "selection.py"
LAYERS = {"encoder.0.fc", "encoder.0.act", "encoder.1.fc", "encoder.1.act", "head"}


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(Block(), Block())
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def is_block(name: str, module: nn.Module) -> bool:
    return isinstance(module, Block)


def is_relu(name: str, module: nn.Module) -> bool:
    return isinstance(module, nn.ReLU)


def watched(model: nn.Module, **selection: object) -> set[str]:
    """Names the scope marks as watched in its module tree (nothing runs)."""
    with layerscope.watch(model, every=1, **selection) as scope:  # type: ignore[arg-type]
        pass
    return {info.name for info in scope.modules if info.watched}


def recorded(model: nn.Module, **selection: object) -> set[str]:
    """Names in the recorded rows' ``module`` column after one training step."""
    pytest.importorskip("pandas")
    with layerscope.watch(model, every=1, **selection) as scope:  # type: ignore[arg-type]
        model(torch.randn(3, 4)).sum().backward()
        scope.step()
    return set(scope.frame()["module"])


def forms(model: Net) -> list[tuple[dict[str, object], set[str]]]:
    """(watch's selection arguments, the names they pick), worked out by hand."""
    encoder, head = model.encoder, model.head
    return [
        ({"include": head}, {"head"}),
        # A module object means itself whole (a Block is picked) and its layers by default.
        ({"include": [encoder[0], head]}, {"encoder.0", "encoder.0.fc", "encoder.0.act", "head"}),
        # A callable's true answer picks a module whatever it is.
        ({"include": is_block}, {"encoder.0", "encoder.1"}),
        ({"include": [is_block, "^head$"]}, {"encoder.0", "encoder.1", "head"}),
        # The Sequential itself whole; the Blocks inside it only by default (they are not).
        (
            {"include": [encoder, re.compile("^head$")], "exclude": is_relu},
            {"encoder", "encoder.0.fc", "encoder.1.fc", "head"},
        ),
        ({"exclude": encoder[1]}, {"encoder.0.fc", "encoder.0.act", "head"}),
        (
            {"exclude": [lambda name, m: name.endswith("act"), "^head$"]},
            {"encoder.0.fc", "encoder.1.fc"},
        ),
        ({"include": encoder, "types": (nn.ReLU,)}, {"encoder.0.act", "encoder.1.act"}),
        ({"include": model}, {"", *LAYERS}),  # the root whole, and every layer inside it
        ({"include": [lambda name, m: False, head, head]}, {"head"}),
    ]


@pytest.mark.parametrize("case", range(10))
def test_each_form_picks_the_modules_worked_out_by_hand(case: int) -> None:
    model = Net()
    selection, expected = forms(model)[case]
    assert watched(model, **selection) == expected


def test_the_recorded_rows_are_of_the_picked_modules() -> None:
    model = Net()
    expected = {"encoder", "encoder.0.fc", "encoder.1.fc", "head"}
    assert recorded(model, include=[model.encoder, "^head$"], exclude=is_relu) == expected
    assert recorded(model, include=is_block) == {"encoder.0", "encoder.1"}


def test_regexes_keep_their_meaning() -> None:
    model = Net()
    assert watched(model) == LAYERS
    assert watched(model, include="encoder") == {"encoder", *LAYERS - {"head"}}
    assert watched(model, include=r"^encoder\.0$") == {"encoder.0"}
    assert watched(model, include=r"encoder\.0\.") == {"encoder.0.fc", "encoder.0.act"}
    assert watched(model, exclude=["act", "^head"]) == {"encoder.0.fc", "encoder.1.fc"}


def test_a_callable_gets_the_clean_name_and_the_module() -> None:
    model = Net()
    model.head = torch.compile(model.head)  # type: ignore[assignment]  # "head._orig_mod"
    seen: dict[str, str] = {}

    def note(name: str, module: nn.Module) -> bool:
        seen.setdefault(name, type(module).__name__)
        return isinstance(module, nn.Linear) and name == "head"

    assert watched(model, include=note) == {"head"}
    assert "head._orig_mod" not in seen
    assert seen["head"] == "OptimizedModule"  # listed before the Linear inside it
    assert (seen[""], seen["encoder.1.act"]) == ("Net", "ReLU")


def test_module_objects_are_found_inside_wrappers() -> None:
    model = Net()
    parallel = nn.DataParallel(model)  # on the CPU: forward calls the model itself
    assert watched(parallel, include=[model.head]) == {"head"}
    assert watched(parallel, include=parallel.module.encoder[1].fc) == {"encoder.1.fc"}
    assert watched(parallel, include=parallel) == {"", *LAYERS}  # the wrapper is the model
    compiled = torch.compile(model)  # never called: nothing is compiled
    assert watched(compiled, include=compiled.head, exclude=model.encoder) == {"head"}


def test_a_shared_module_is_picked_under_its_first_name() -> None:
    shared = nn.Linear(4, 4)
    model = nn.Sequential(shared, nn.ReLU(), shared)  # named_modules lists it once, as "0"
    assert watched(model, include=model[2]) == {"0"}


def test_callables_run_at_watch_time_only() -> None:
    model = Net()
    names = [name for name, _ in model.named_modules()]
    included: list[str] = []
    excluded: list[str] = []

    def is_linear(name: str, module: nn.Module) -> bool:
        included.append(name)
        return isinstance(module, nn.Linear)

    def is_act(name: str, module: nn.Module) -> bool:
        excluded.append(name)
        return name.endswith("act")

    with layerscope.watch(model, every=1, include=is_linear, exclude=is_act) as scope:
        # exclude is asked of every module, include of those not excluded; each once
        assert sorted(excluded) == sorted(names)
        assert sorted(included) == sorted(set(names) - {"encoder.0.act", "encoder.1.act"})
        for _ in range(3):
            model(torch.randn(3, 4)).sum().backward()
            scope.step()
    assert len(excluded) == len(names)  # training asked nothing more
    assert len(included) == len(names) - 2


def test_a_callable_that_raises_names_the_argument_and_leaves_no_hook() -> None:
    model = Net()

    def broken(name: str, module: nn.Module) -> bool:
        return {"head": True}[name]

    with pytest.raises(ValueError, match=r"^exclude: <callable broken> raised KeyError for "):
        layerscope.watch(model, exclude=broken)
    with pytest.raises(ValueError, match=r"^include: <callable lambda> raised Attr") as caught:
        layerscope.watch(model, include=lambda name, module: module.missing)
    assert isinstance(caught.value.__cause__, AttributeError)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert watched(model, include=model.head) == {"head"}  # nothing was left claimed


@pytest.mark.parametrize(
    ("selection", "error", "message"),
    [
        ({"include": 3}, TypeError, r"^include: expected a regex string, .* a module of the "),
        ({"exclude": ["ok", 3.5]}, TypeError, r"^exclude: expected .* got 3\.5 \(float\)"),
        ({"include": {"head"}}, TypeError, r"^include: expected .* or a list of them; got set"),
        ({"include": nn.Linear}, TypeError, r"^include: got the class Linear; pass types="),
        ({"include": lambda name: True}, TypeError, r"^include: a callable is called as fn"),
        ({"include": nn.Linear(4, 2)}, ValueError, r"^include: the Linear module given is not"),
        ({"exclude": "("}, ValueError, r"^exclude: invalid regex"),
    ],
)
def test_bad_items_get_errors_that_name_the_argument(selection, error, message) -> None:
    with pytest.raises(error, match=message):
        layerscope.watch(Net(), **selection)


def test_a_copy_s_module_is_not_the_model_s() -> None:
    model = Net()
    with pytest.raises(ValueError, match=r"^exclude: the Sequential module given is not part"):
        layerscope.watch(model, exclude=copy.deepcopy(model).encoder)


def test_the_saved_config_says_what_was_given_and_the_run_reads_back(tmp_path, capsys) -> None:
    pytest.importorskip("duckdb")
    model = Net()
    path = tmp_path / "run"
    include = [model.encoder[0], is_block, "^head$", model]
    exclude = [model.encoder[0].act, lambda name, m: name == "encoder.1.act"]
    with layerscope.watch(model, run=path, every=1, include=include, exclude=exclude) as scope:
        for _ in range(2):
            model(torch.randn(3, 4)).sum().backward()
            scope.step()
    config = json.loads((path / "run.json").read_text())["config"]
    given = ["<module encoder.0>", "<callable is_block>", "^head$", "<module (root)>"]
    assert config["include"] == given
    assert config["exclude"] == ["<module encoder.0.act>", "<callable lambda>"]

    run = layerscope.load(path)
    expected = {"", "encoder.0", "encoder.0.fc", "encoder.1", "encoder.1.fc", "head"}
    assert set(run.stats["module"]) == expected
    assert {info.name for info in run.modules if info.watched} == expected
    assert run.meta["config"]["include"] == given
    assert main(["summary", str(path), "--plain"]) == 0
    out = capsys.readouterr().out
    assert "encoder.1.fc" in out
    assert "encoder.0.act" not in out


def test_the_in_memory_config_says_the_same() -> None:
    model = Net()
    with layerscope.watch(model, include=[model.head, is_block], exclude="1") as scope:
        config = scope.config.to_dict()
    assert (config["include"], config["exclude"]) == (
        ["<module head>", "<callable is_block>"],
        ["1"],
    )


@pytest.mark.slow
def test_the_docs_snippet_prints_what_the_page_shows(tmp_path) -> None:
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(
        [sys.executable, str(SNIPPET)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == SNIPPET.with_suffix(".out").read_text()


DDP_SCRIPT = """
import os, sys
import torch.distributed as dist
from torch import nn
import layerscope

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
dist.init_process_group("gloo", rank=0, world_size=1)
model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
ddp = nn.parallel.DistributedDataParallel(model)
with layerscope.watch(ddp, include=[ddp.module[1]], exclude=lambda n, m: n == "1.1") as scope:
    pass
print(sorted(info.name for info in scope.modules if info.watched))
dist.destroy_process_group()
"""


def test_module_objects_are_found_inside_ddp(tmp_path) -> None:
    import socket

    with socket.socket() as probe:  # a free port for the one-process group
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = subprocess.run(
        [sys.executable, "-c", DDP_SCRIPT, str(port)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    # "1" (a Sequential) meant whole, "1.0" inside it by default, "1.1" excluded
    assert result.stdout.strip().splitlines()[-1] == "['1', '1.0']"
