"""The watch() contract: arguments, selection, module tree, call order, public surface."""

import re
import subprocess
import sys

import pytest
import torch
from torch import nn

import layerscope
from layerscope import Schedule


def _mlp():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def _step(model, scope, batch=3):
    model(torch.randn(batch, 4)).sum().backward()
    scope.step()


@pytest.mark.parametrize(
    ("kwargs", "error", "names"),
    [
        ({"model": "not a module"}, TypeError, "model"),
        ({"include": "("}, ValueError, "include"),
        ({"exclude": ["ok", "[bad"]}, ValueError, "exclude"),
        ({"include": 3}, TypeError, "include"),
        ({"stats": ["mean", "median"]}, ValueError, "stats"),
        ({"stats": {"mean": lambda t: t.mean()}}, ValueError, "stats"),
        ({"stats": {"x": 3}}, TypeError, "stats"),
        ({"kinds": ("activation", "gradients")}, ValueError, "kinds"),
        ({"kinds": ("update",)}, ValueError, "optimizer"),
        ({"every": 0}, ValueError, "every"),
        ({"every": -3}, ValueError, "every"),
        ({"every": 2.5}, TypeError, "every"),
        ({"types": (int,)}, TypeError, "types"),
        ({"histogram": "log10"}, ValueError, "histogram"),
        ({"histogram": ("linear", 1, 0, 10)}, ValueError, "histogram"),
        ({"include": "no_such_module"}, ValueError, "no module selected"),
        ({"optimizer": "sgd"}, TypeError, "optimizer"),
        ({"optimizer": []}, ValueError, "optimizer"),
        (
            {"optimizer": [torch.optim.SGD(_mlp().parameters(), lr=1), "sgd"]},
            TypeError,
            "optimizer",
        ),
        ({"alerts": "loud"}, ValueError, "alerts"),
        ({"alerts": 3}, TypeError, "alerts"),
    ],
)
def test_bad_input_gets_a_clear_error_naming_the_argument(kwargs, error, names):
    arguments = {"model": _mlp(), **kwargs}
    model = arguments.pop("model")
    with pytest.raises(error, match=re.escape(names)):
        layerscope.watch(model, **arguments)


def test_a_failed_watch_leaves_no_hook_behind():
    model = _mlp()
    with pytest.raises(ValueError, match="kinds"):
        layerscope.watch(model, kinds=("activation", "nope"))
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_a_model_watched_by_an_open_scope_is_refused_until_it_closes(tmp_path):
    model = _mlp()
    first = layerscope.watch(model, every=1)
    hooks = sum(len(m._forward_hooks) for m in model.modules())
    with pytest.raises(ValueError, match=r"model: .* already watched"):
        layerscope.watch(model, every=1, run=tmp_path / "second")
    with pytest.raises(ValueError, match="already watched"):  # a part of it, too
        layerscope.watch(model[0])
    assert sum(len(m._forward_hooks) for m in model.modules()) == hooks
    assert not (tmp_path / "second").exists()
    _step(model, first)
    first.close()
    with layerscope.watch(model, every=1) as second:  # closed: free again
        _step(model, second)
    assert len(second.frame()) == len(first.frame())


def test_optimizer_wrappers_are_looked_through_and_unhookable_ones_refused(tmp_path):
    model = _mlp()
    inner = torch.optim.SGD(model.parameters(), lr=0.1)

    class Wrapper(torch.optim.Optimizer):  # like accelerate's: no Optimizer.__init__
        def __init__(self, optimizer):
            self.optimizer = optimizer

        @property
        def param_groups(self):
            return self.optimizer.param_groups

        def step(self, closure=None):
            return self.optimizer.step(closure)

    with layerscope.watch(model, optimizer=Wrapper(inner), every=1) as scope:
        model(torch.randn(2, 4)).sum().backward()
        Wrapper(inner).step()
    assert scope.current_step == 1
    assert "weight_grad" in set(scope.frame().kind)

    class Unhookable(torch.optim.Optimizer):
        def __init__(self):
            self.param_groups = []

    with pytest.raises(TypeError, match="optimizer: expected"):
        layerscope.watch(model, optimizer=Unhookable(), run=tmp_path / "r")
    assert not (tmp_path / "r").exists()
    assert all(not m._forward_hooks for m in model.modules())


def test_a_watch_that_fails_after_the_store_started_leaves_no_run_behind(tmp_path, monkeypatch):
    def refuse(self):
        raise RuntimeError("no hooks today")

    from layerscope.hooks._layers import LayerHooks

    monkeypatch.setattr(LayerHooks, "register", refuse)
    model = _mlp()
    with pytest.raises(RuntimeError, match="no hooks today"):
        layerscope.watch(model, run=tmp_path / "r")
    assert not (tmp_path / "r").exists()
    monkeypatch.undo()
    with layerscope.watch(model, every=1, run=tmp_path / "r") as scope:  # the retry works
        _step(model, scope)
    assert len(layerscope.load(tmp_path / "r").stats) == len(scope.frame())


def test_schedule_records_dense_then_sparse_steps():
    schedule = Schedule(every=5, start=2, stop=20, dense=3)
    assert [s for s in range(30) if schedule.records(s)] == [2, 3, 4, 7, 12, 17]
    with pytest.raises(ValueError, match="every"):
        Schedule(every=0)
    with pytest.raises(ValueError, match="stop"):
        Schedule(start=5, stop=2)
    for stop in (True, 2.5):
        with pytest.raises(TypeError, match="stop"):
            Schedule(stop=stop)


def test_every_n_records_only_those_steps_and_counts_all_steps():
    model = _mlp()
    with layerscope.watch(model, every=3) as scope:
        for _ in range(7):
            _step(model, scope)
        assert scope.current_step == 7
    frame = scope.frame()
    assert sorted(set(frame.step)) == [0, 3, 6]
    assert not frame.sentinel.any()  # on the CPU the sentinel is off unless asked for
    with layerscope.watch(model, every=Schedule(every=3, sentinel=True)) as scope:
        for _ in range(7):
            _step(model, scope)
    frame = scope.frame()
    assert sorted(set(frame[~frame.sentinel].step)) == [0, 3, 6]
    assert sorted(set(frame[frame.sentinel].step)) == [1, 2, 4, 5]


def test_default_selection_skips_containers_and_keeps_leaves():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(8))
            self.body = nn.Sequential(nn.Linear(8, 8), nn.GELU())

        def forward(self, x):
            return self.body(x) * self.scale

    model = nn.Sequential(nn.Linear(4, 8), Block(), nn.ModuleList([nn.Linear(8, 8)]))
    model.forward = lambda x: model[2][0](model[1](model[0](x)))
    with layerscope.watch(model, every=1) as scope:
        model(torch.randn(2, 4)).sum().backward()
        scope.step()
    watched = {info.name for info in scope.modules if info.watched}
    # Block owns a parameter; Sequential and ModuleList are containers; GELU is a leaf.
    assert watched == {"0", "1", "1.body.0", "1.body.1", "2.0"}
    assert set(scope.frame().module) == watched


def test_include_exclude_and_types_select_modules():
    model = nn.Sequential(
        nn.Sequential(nn.Linear(4, 4), nn.ReLU()), nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    )

    def watched(**kwargs):
        scope = layerscope.watch(model, every=1, **kwargs)
        scope.close()
        return {info.name for info in scope.modules if info.watched}

    assert watched(include=r"^0\.") == {"0.0", "0.1"}
    assert watched(exclude="ReLU|1$") == {"0.0", "1.0"}  # names, not types: "0.1" ends in 1
    assert watched(types=(nn.Linear,)) == {"0.0", "1.0"}
    assert watched(include=["^1$"]) == {"1"}  # a container named whole is picked
    assert watched(include=r"1\.") == {"1.0", "1.1"}  # but not by a partial match
    assert watched(include=re.compile(r"\.0$"), types=(nn.Linear,)) == {"0.0", "1.0"}


def test_module_tree_has_types_shapes_counts_and_children():
    model = _mlp()
    scope = layerscope.watch(model)
    scope.close()
    tree = {info.name: info for info in scope.modules}
    assert tree[""].children == ("0", "1", "2")
    assert tree[""].num_parameters == 0
    assert tree[""].num_parameters_total == 4 * 8 + 8 + 8 * 2 + 2
    assert tree["0"].type == "Linear"
    assert tree["0"].parameters == {"weight": (8, 4), "bias": (8,)}
    assert tree["0"].num_parameters == 40
    assert tree["1"].watched
    assert not tree[""].watched
    assert tree["2"].to_dict()["parameters"] == {"weight": [2, 8], "bias": [2]}


def test_calls_hold_the_enter_exit_order_of_one_forward_pass():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)

        def forward(self, x):
            return self.a(self.b(self.a(x)))

    model = Net()
    with layerscope.watch(model, every=1) as scope:
        for _ in range(2):  # two micro-batches: one forward pass is logged
            model(torch.randn(2, 4)).sum().backward()
        scope.step()
        _step_model = model(torch.randn(2, 4)).sum()
        _step_model.backward()
        scope.step()
    one_pass = [
        ("enter", "a", 0),
        ("exit", "a", 0),
        ("enter", "b", 0),
        ("exit", "b", 0),
        ("enter", "a", 1),
        ("exit", "a", 1),
    ]
    events = [(c.event, c.module, c.call) for c in scope.calls]
    assert events == one_pass + one_pass  # each step's, of its first pass only
    assert [c.seq for c in scope.calls] == list(range(6)) * 2
    assert [c.step for c in scope.calls] == [0] * 6 + [1] * 6
    assert list(scope.frame("calls").columns) == ["step", "seq", "event", "module", "call"]


def test_frame_has_the_contract_columns_and_custom_ones():
    model = _mlp()
    stats = [
        "mean",
        "hist",
        {
            "top": lambda t: t.abs().amax(),
            "q": lambda t: t.float().quantile(torch.tensor([0.5, 0.9])),
        },
    ]
    with layerscope.watch(model, every=1, stats=stats) as scope:
        _step(model, scope)
    frame = scope.frame()
    assert list(frame.columns) == [
        "step",
        "phase",
        "rank",
        "module",
        "module_type",
        "kind",
        "tensor",
        "call",
        "sentinel",
        "dtype",
        "shape",
        "shard",
        "numel",
        "mean",
        "hist",
        "top",
        "q",
    ]
    weight = frame.query("module == '0' and kind == 'weight' and tensor == 'weight'").iloc[0]
    assert weight.top == pytest.approx(model[0].weight.abs().max().item())
    assert weight.q == pytest.approx(
        model[0].weight.detach().quantile(torch.tensor([0.5, 0.9])).tolist()
    )
    assert weight["hist"].sum() == 32
    assert weight["hist"].dtype.name == "int64"


def test_a_custom_stat_that_returns_a_view_keeps_the_values_it_saw():
    # float64 needs no conversion, so a view of the activation would reach the flush, after
    # the in-place ReLU overwrote it, were the values not copied when they are kept.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(inplace=True)).double()
    seen = []

    def head(tensor):
        seen.append(tensor.reshape(-1)[:4].clone())
        return tensor.reshape(-1)[:4]

    with layerscope.watch(model, every=1, stats=["mean", {"head": head}]) as scope:
        model(torch.randn(3, 4, dtype=torch.float64)).sum().backward()
        scope.step()
    row = scope.frame().query("module == '0' and kind == 'activation'").iloc[0]
    assert (seen[0] < 0).any()  # the ReLU changes these values after the hook
    assert list(row["head"]) == pytest.approx(seen[0].tolist(), rel=1e-12)


def test_all_default_columns_present_even_when_nothing_was_recorded():
    scope = layerscope.watch(_mlp(), every=Schedule(start=10))
    scope.close()
    frame = scope.frame()
    assert len(frame) == 0
    for column in ("step", "kind", "mean", "std", "absmax", "l2", "zero_frac", "hist"):
        assert column in frame.columns


def test_histogram_none_and_linear():
    model = _mlp()
    with layerscope.watch(model, every=1, histogram=None) as scope:
        _step(model, scope)
    assert "hist" not in scope.frame().columns
    with layerscope.watch(model, every=1, histogram=("linear", -1, 1, 4)) as scope:
        _step(model, scope)
    row = scope.frame().query("module == '0' and kind == 'weight' and tensor == 'weight'").iloc[0]
    expected = torch.histc(model[0].weight.detach().clamp(-1, 0.999), 4, -1, 1)
    assert row["hist"].tolist() == [0, *expected.long().tolist(), 0]


def test_a_closed_scope_refuses_steps_but_keeps_its_frame():
    model = _mlp()
    scope = layerscope.watch(model, every=1)
    _step(model, scope)
    scope.close()
    scope.close()  # twice is fine
    with pytest.raises(RuntimeError, match="closed"):
        scope.step()
    assert len(scope.frame()) > 0
    assert "closed" in repr(scope)


def test_frame_needs_pandas_with_a_helpful_error(monkeypatch):
    scope = layerscope.watch(_mlp())
    scope.close()
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match=r"pip install 'layerscope\[dataframe\]'"):
        scope.frame()


def test_frame_rejects_unknown_tables():
    scope = layerscope.watch(_mlp())
    scope.close()
    with pytest.raises(ValueError, match="table"):
        scope.frame("alerts!")


def test_public_api_is_sorted_and_complete():
    assert layerscope.__all__ == sorted(layerscope.__all__)
    for name in layerscope.__all__:
        assert hasattr(layerscope, name), name
    # dir() shows the face, whichever of the stages' packages were imported since.
    assert [n for n in dir(layerscope) if not n.startswith("_")] == [
        n for n in layerscope.__all__ if not n.startswith("_")
    ]


def test_watch_pulls_in_torch_and_the_standard_library_only():
    code = (
        "import sys, layerscope; layerscope.watch, layerscope.Scope, layerscope.capture; "
        "heavy = {'pandas', 'pyarrow', 'duckdb', 'matplotlib', 'plotly', 'tensorboard', "
        "'lightning', 'transformers', 'wandb', 'mlflow', 'starlette', 'uvicorn', 'rich', "
        "'safetensors'}; "
        "print(sorted(heavy & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_compiled_models_are_told_apart_from_other_wrappers():
    from layerscope.model import is_compiled, unwrap

    model = _mlp()
    compiled = torch.compile(model)  # no call: nothing is compiled yet
    assert is_compiled(compiled, unwrap(compiled))
    assert not is_compiled(model, model)
    data_parallel = nn.DataParallel(model)
    assert not is_compiled(data_parallel, unwrap(data_parallel))
    in_place = _mlp()
    in_place.compile()
    assert is_compiled(in_place, in_place)
