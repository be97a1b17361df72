"""What the GPU path launches per recorded tensor, counted with the path forced on CPU tensors.

The Triton kernels run in triton's interpreter; every aten op goes through a dispatch mode
that counts it. A watched training step and an unwatched copy's step run the same user ops,
so the difference is layerscope's own: two Triton launches per activation and gradient, two
per dtype group of each parameter kind, the update's three foreach ops, one foreach norm of
the parameters an adaptive optimizer steps (the health rules' bound of its step), a dozen
small ops for the spread of the model's output (``not_learning``'s), one concatenation per
flush, and nothing that reads a value back. A group whose tensors moved
since its last read (gradients that ``zero_grad()`` freed) sends its table of offsets anew:
built on the host (``lift_fresh`` here), a non-blocking copy from pinned memory on a GPU. In
every configuration (every kind, histogram and instrument; either sentinel), the training
thread reads no value back beyond what the unwatched training reads itself.
"""

from __future__ import annotations

import collections
import copy
import os
import threading
from collections.abc import Iterator

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

import layerscope

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("forces the GPU path in triton's interpreter", allow_module_level=True)

from layerscope.stats import _triton, _triton_kernels

# Ops that launch nothing: allocation and views.
_FREE = {
    "empty", "empty_strided", "view", "_unsafe_view", "as_strided", "detach", "alias", "t",
    "transpose", "permute", "expand", "slice", "select", "unsqueeze", "squeeze", "_reshape_alias",
}  # fmt: skip
# The update itself (after - before of every parameter) and the flush's one payload.
_UPDATE_OPS = {"_foreach_copy_", "_foreach_neg_", "_foreach_add_"}
_FLUSH_OPS = {"cat"}
_RATE_OPS = {"_foreach_norm"}
_TABLE_OPS = {"lift_fresh"}
# The spread of the model's output (hooks._output_spread): its mean, the centred squares',
# the units' means and theirs, their difference over the whole, kept within [0, 1], a root.
_SPREAD_OPS = {"mean": 4, "sub": 2, "pow": 2, "div": 1, "nan_to_num": 1, "clamp": 1, "sqrt": 1}
EVERY_KIND = ("input", "activation", "grad", "weight", "weight_grad", "update", "buffer")


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


class _CountLaunches:
    """Stands in for a kernel: counts its launches, which run outside the dispatch mode."""

    def __init__(self, kernel: object, launches: list[str], name: str) -> None:
        self.kernel, self.launches, self.name = kernel, launches, name

    def __getitem__(self, grid: tuple[int, ...]):  # type: ignore[no-untyped-def]
        run = self.kernel[grid]  # type: ignore[index]

        def launch(*args, **kwargs):  # type: ignore[no-untyped-def]
            self.launches.append(self.name)
            with _disable_current_modes():  # the interpreter's own copies are not launches
                return run(*args, **kwargs)

        return launch


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    counted: list[str] = []
    for name in ("partials_kernel", "finish_kernel", "extremes_kernel", "extremes_finish_kernel"):
        kernel = getattr(_triton_kernels, name)
        monkeypatch.setattr(_triton_kernels, name, _CountLaunches(kernel, counted, name))
    with _triton.on_cpu():
        yield counted


class _Positive(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x > 0  # a boolean activation


class _Float8(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.detach().to(torch.float8_e4m3fn)  # an fp8 activation (no gradient)


class _Model(nn.Module):
    """Token ids (int64) in; float32, float16 and bfloat16 layers; a boolean and an fp8 output."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
        self.narrow = nn.Linear(8, 8).to(torch.float16)
        self.positive = _Positive()
        self.codes = _Float8()
        self.head = nn.Linear(8, 4).to(torch.bfloat16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.narrow(self.mlp(self.embed(ids)).to(torch.float16)).float()
        x = x * self.positive(x) + self.codes(x + 1).float()  # each input read once
        return self.head(x.to(torch.bfloat16)).float()


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, ids: torch.Tensor) -> None:
    loss = model(ids).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def _step_ops(model: nn.Module, optimizer: torch.optim.Optimizer, ids: torch.Tensor):  # type: ignore[no-untyped-def]
    with _CountOps() as counter:
        _train(model, optimizer, ids)
    return counter.ops


def _twins():  # type: ignore[no-untyped-def]
    """A model and an unwatched copy, each with its optimizer, and token ids."""
    torch.manual_seed(0)
    model = _Model()
    plain = copy.deepcopy(model)
    ids = torch.randint(0, 50, (4, 6))
    # eps that float16 holds: AdamW's 1e-8 is 0 there, and the float16 layer's update Inf
    optimizers = tuple(torch.optim.AdamW(m.parameters(), eps=1e-3) for m in (model, plain))
    return model, plain, ids, optimizers


@pytest.mark.parametrize("histogram", ["log2", ("linear", -2.0, 2.0, 20)], ids=["log2", "linear"])
def test_each_recorded_tensor_costs_two_launches_and_parameters_two_per_group(launches, histogram):
    model, plain, ids, (optimizer, plain_optimizer) = _twins()
    _train(plain, plain_optimizer, ids)
    unwatched = _step_ops(plain, plain_optimizer, ids)
    kinds = ("input", "activation", "grad", "weight", "weight_grad", "update")
    with layerscope.watch(
        model, optimizer=optimizer, every=1, kinds=kinds, histogram=histogram
    ) as scope:
        _train(model, optimizer, ids)
        launches.clear()
        watched = _step_ops(model, optimizer, ids)
        step_launches = list(launches)
    frame = scope.frame()
    rows = frame[frame["step"] == 1]
    per_tensor = rows[rows["kind"].isin(["input", "activation", "grad"])]
    # Inputs that are the previous module's output share its row: count distinct readings.
    # Token ids (the integer path), booleans, fp8 and three floating dtypes: two launches each.
    assert set(per_tensor["dtype"]) == {
        "int64", "float32", "float16", "bfloat16", "bool", "float8_e4m3fn",
    }  # fmt: skip
    groups = rows[rows["kind"].isin(["weight", "weight_grad", "update"])]
    group_count = len(groups.groupby(["kind", "dtype"]))
    assert group_count == 9  # float32, float16 and bfloat16, three kinds
    read_alone = len(per_tensor.drop_duplicates(["module", "kind", "tensor"]))
    shared = _inputs_shared_with_outputs(rows)
    assert len(step_launches) == 2 * (read_alone - shared) + 2 * group_count
    assert step_launches.count("partials_kernel") <= step_launches.count("finish_kernel")

    own = watched - unwatched
    launched = {op: n for op, n in own.items() if op not in _FREE}
    allowed = _UPDATE_OPS | _FLUSH_OPS | _TABLE_OPS | _RATE_OPS | set(_SPREAD_OPS)
    assert set(launched) <= allowed, launched
    # The output's spread, once a recorded step (the model's output is float32: no copy).
    assert all(launched[op] == n for op, n in _SPREAD_OPS.items()), launched
    assert launched.get("_foreach_norm", 0) == 1  # one optimizer, AdamW: one list
    # Three parameter dtypes: each foreach op runs once per list; one payload per flush; the
    # weights' and updates' tables are kept, the new gradients' sent again.
    assert all(n <= 3 for op, n in launched.items() if op in _UPDATE_OPS), launched
    assert launched.get("cat", 0) == 1
    assert launched.get("lift_fresh", 0) <= 3
    for never in ("_local_scalar_dense", "item", "nonzero", "_to_copy", "copy_"):
        assert never not in own, never  # no read back, no copy of a row from a host list
    # Two steps each, watched with every kind but buffers (it has none) and not: the same model.
    for a, b in zip(model.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a, b)


def _inputs_shared_with_outputs(rows) -> int:  # type: ignore[no-untyped-def]
    """Inputs recorded from a tensor already read as the previous module's output."""
    inputs = rows[rows["kind"] == "input"]
    outputs = rows[rows["kind"] == "activation"]
    keys = ["mean", "min", "max", "numel", "dtype"]
    out = {tuple(row) for row in outputs[keys].itertuples(index=False)}
    return sum(tuple(row) in out for row in inputs[keys].itertuples(index=False))


def test_a_step_of_the_gradients_sentinel_costs_two_launches_per_dtype(launches):
    model, plain, ids, (optimizer, plain_optimizer) = _twins()
    _train(plain, plain_optimizer, ids)
    unwatched = _step_ops(plain, plain_optimizer, ids)
    schedule = layerscope.Schedule(every=100, sentinel="gradients")
    with layerscope.watch(model, optimizer=optimizer, every=schedule, kinds=EVERY_KIND) as scope:
        _train(model, optimizer, ids)  # step 0: recorded
        _train(model, optimizer, ids)  # step 1: the sentinel's first, tables built
        launches.clear()
        watched = _step_ops(model, optimizer, ids)
        step_launches = list(launches)
    frame = scope.frame()
    sentinel = frame[frame["sentinel"] & (frame["step"] == 2)]
    assert set(sentinel["kind"]) == {"weight_grad"}
    assert set(sentinel["dtype"]) == {"float32", "float16", "bfloat16"}
    # Three dtypes, two launches each, whatever the number of parameters: no module hook ran.
    assert len(step_launches) == 6
    assert len(sentinel) == len(list(model.parameters()))
    own = watched - unwatched
    launched = {op: n for op, n in own.items() if op not in _FREE}
    assert set(launched) <= _TABLE_OPS, launched  # the new gradients' tables, no other op


# Ops that read a value back to the host: each one waits for the GPU. (Which way a copy goes
# does not show on CPU tensors: the tests marked cuda catch a copy that waits.)
_READ_BACK = {
    "_local_scalar_dense", "item", "nonzero", "is_nonzero", "masked_select", "_unique2",
    "unique_dim", "unique_consecutive", "equal", "allclose",
}  # fmt: skip


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)
        self.out = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, 2, 4).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(batch, length, 8))


class _Transformer(nn.Module):
    """Token ids, attention, and a batch norm whose buffers hold an int64 counter."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.attention = _Attention()
        self.norm = nn.BatchNorm1d(8)
        self.head = nn.Linear(8, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.attention(self.embed(ids))
        return self.head(self.norm(x.transpose(1, 2)).transpose(1, 2))


class _TrainingThreadReads:
    """Counts values read back on the training thread by calls no dispatch mode sees."""

    NAMES = ("tolist", "numpy", "item", "__bool__", "__int__", "__float__", "__index__")

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        training = threading.get_ident()
        for name in self.NAMES:
            original = getattr(torch.Tensor, name)

            def counted(tensor, *args, _name=name, _original=original, **kwargs):  # type: ignore[no-untyped-def]
                if threading.get_ident() == training:
                    self.calls[_name] += 1
                return _original(tensor, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)


CONFIGURATIONS = {
    "every kind and instrument": {
        "every": 1, "kinds": EVERY_KIND, "histogram": ("linear", -1.0, 1.0, 8),
        "tensors": ["attention.qkv"], "attention": True, "noise_scale": True,
    },
    "per-layer sentinel": {"every": layerscope.Schedule(every=2, sentinel=True)},
    "gradients' sentinel": {"every": layerscope.Schedule(every=2, sentinel="gradients")},
}  # fmt: skip


def _read_backs(model, monkeypatch, watching=None):  # type: ignore[no-untyped-def]
    """Values read back on the training thread over 2 steps of 2 micro-batches each."""
    optimizer = torch.optim.AdamW(model.parameters())
    ids = torch.randint(0, 50, (4, 6), generator=torch.Generator().manual_seed(0))
    scope = None if watching is None else layerscope.watch(model, optimizer=optimizer, **watching)
    with monkeypatch.context() as patched, _CountOps() as counter:
        reads = _TrainingThreadReads(patched)
        for _ in range(2):  # with every=2: one recorded step, one the sentinel watches
            for half in ids.chunk(2):
                model(half).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    ops = collections.Counter({op: n for op, n in counter.ops.items() if op in _READ_BACK})
    return ops + reads.calls, scope


@pytest.mark.parametrize("options", CONFIGURATIONS.values(), ids=CONFIGURATIONS.keys())
def test_no_configuration_reads_a_value_back_on_the_training_thread(
    launches, monkeypatch, tmp_path, options
):
    torch.manual_seed(0)
    model = _Transformer()
    unwatched, _ = _read_backs(copy.deepcopy(model), monkeypatch)
    watched, scope = _read_backs(model, monkeypatch, {"run": tmp_path / "run", **options})
    assert scope is not None
    scope.close()
    # The same reads as the unwatched training's own (its optimizer's step counter on a CPU).
    assert watched == unwatched
    assert scope.failures == 0
    assert launches  # the GPU path read the tensors
    assert set(scope.frame()["step"]) == {0, 1}
