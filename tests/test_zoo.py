"""Every row of ``scope.frame()`` against an independent recorder, over a zoo of toy models.

The reference recorder below uses plain PyTorch hooks in the same forward and backward pass as
the scope: forward hooks that clone each output (before any later in-place op), tensor hooks
that clone each output's gradient, and reads of parameters and their ``.grad``. Its statistics
are computed in numpy float64 from the clones; nothing here calls ``layerscope.stats``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections import Counter
from collections.abc import Iterator, Mapping
from functools import partial
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor, nn

import layerscope
from tests.fixtures import zoo

KINDS = ("activation", "grad", "weight", "weight_grad")
CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
RTOL = 1e-5  # float32 moments, relative to the tensor's absmax
FLOAT_STATS = ("mean", "std", "min", "max", "absmax", "l2")
EXACT_STATS = ("numel", "zero_frac", "neg_frac", "pos_frac", "nan_count", "inf_count")

Key = tuple[str, str, str, int]  # module, kind, tensor, call


# ---------------------------------------------------------------------------- reference recorder


def expected_targets(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Modules that own a parameter or have no children, pure containers excepted."""
    targets = []
    for name, module in model.named_modules():
        if isinstance(module, CONTAINERS):
            continue
        owns = any(True for _ in module.parameters(recurse=False))
        leaf = not any(True for _ in module.children())
        if owns or leaf:
            targets.append((name, module))
    return targets


def flatten(value: Any, prefix: str) -> Iterator[tuple[str, Tensor]]:
    """Tensors in a nested output, named ``out``, ``out.0``, ``out.<key>``, ``out.<field>``."""
    if isinstance(value, Tensor):
        yield prefix, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from flatten(item, f"{prefix}.{key}")
    elif isinstance(value, tuple) and hasattr(value, "_fields"):
        for field_name in value._fields:
            yield from flatten(getattr(value, field_name), f"{prefix}.{field_name}")
    elif isinstance(value, tuple | list):
        for index, item in enumerate(value):
            yield from flatten(item, f"{prefix}.{index}")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from flatten(getattr(value, field.name), f"{prefix}.{field.name}")


def to_numpy(tensor: Tensor) -> np.ndarray:
    """The stored values: floats exactly as float64, integers and bools as they are."""
    tensor = tensor.detach().cpu()
    if tensor.is_floating_point():
        return tensor.double().numpy().copy()
    return tensor.numpy().copy()


@dataclasses.dataclass
class Entry:
    module_type: str
    dtype: str
    shape: tuple[int, ...]
    parts: list[np.ndarray]

    @property
    def values(self) -> np.ndarray:
        return np.concatenate([part.reshape(-1) for part in self.parts])


class Recorder:
    """Clones of what layerscope should see, keyed by (module, kind, tensor, call)."""

    def __init__(self, model: nn.Module) -> None:
        self.targets = expected_targets(model)
        self.entries: dict[Key, Entry] = {}
        self._calls: Counter[str] = Counter()
        self._handles = [model.register_forward_pre_hook(lambda *_: self._calls.clear())]
        for name, module in self.targets:
            self._handles.append(module.register_forward_hook(partial(self._on_forward, name)))

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()

    def _add(self, key: Key, module: nn.Module, tensor: Tensor, replace: bool = False) -> None:
        values = to_numpy(tensor)
        entry = self.entries.get(key)
        if entry is None or replace:
            dtype = str(tensor.dtype).removeprefix("torch.")
            self.entries[key] = Entry(type(module).__name__, dtype, tuple(tensor.shape), [values])
        else:
            entry.parts.append(values)

    def _on_forward(self, name: str, module: nn.Module, args: Any, output: Any) -> None:
        call = self._calls[name]
        self._calls[name] += 1
        for tensor_name, tensor in flatten(output, "out"):
            self._add((name, "activation", tensor_name, call), module, tensor)
            if tensor.requires_grad:
                key = (name, "grad", tensor_name, call)
                tensor.register_hook(partial(self._on_grad, key, module))

    def _on_grad(self, key: Key, module: nn.Module, grad: Tensor | None) -> None:
        if grad is not None:
            self._add(key, module, grad)

    def read_parameters(self, kind: str) -> None:
        """Own parameters (``weight``) or their gradients (``weight_grad``) of every target."""
        for name, module in self.targets:
            for param_name, param in module.named_parameters(recurse=False):
                value = param.grad if kind == "weight_grad" else param
                if value is not None:
                    self._add((name, kind, param_name, 0), module, value, replace=True)


# ---------------------------------------------------------------------------- reference statistics


def reference_stats(values: np.ndarray) -> dict[str, float]:
    """Statistics of the finite values in float64; counts only for non-floating dtypes."""
    flat = values.reshape(-1)
    numel = flat.size
    nan = math.nan
    out: dict[str, float] = {"numel": numel, "nan_count": 0, "inf_count": 0}
    if flat.dtype.kind == "f":
        finite = flat[np.isfinite(flat)]
        count = finite.size
        out["mean"] = finite.mean() if count else nan
        out["std"] = finite.std(ddof=1) if count > 1 else nan
        out["min"] = finite.min() if count else nan
        out["max"] = finite.max() if count else nan
        out["absmax"] = np.abs(finite).max() if count else nan
        out["l2"] = math.sqrt(np.square(finite).sum()) if count else nan
        out["nan_count"] = int(np.isnan(flat).sum())
        out["inf_count"] = int(np.isinf(flat).sum())
    else:
        out.update(dict.fromkeys(FLOAT_STATS, nan))
    for name, hits in (("zero_frac", flat == 0), ("neg_frac", flat < 0), ("pos_frac", flat > 0)):
        out[name] = hits.sum() / numel if numel else nan
    return out


def reference_hist(values: np.ndarray) -> np.ndarray:
    """Log2 bins of float32 values: frexp's exponent e puts a normal value in bin e + 126."""
    flat = values.reshape(-1).astype(np.float64)
    bins = np.zeros(flat.size, dtype=np.int64)
    finite = np.isfinite(flat)
    normal = finite & (np.abs(flat) >= 2.0**-126)
    bins[normal] = np.frexp(flat[normal])[1] + 126
    bins[~finite] = 255
    return np.bincount(bins, minlength=256)


def sparse_bins(hist: np.ndarray) -> list[tuple[int, int]]:
    return [(int(b), int(hist[b])) for b in np.flatnonzero(hist)]


def same(got: float, expected: float, tol: float) -> bool:
    if math.isnan(expected):
        return math.isnan(got)
    return abs(got - expected) <= tol


def row_mismatches(row: Mapping[str, Any], entry: Entry) -> list[str]:
    """What differs between one frame row and the reference, as readable lines."""
    values = entry.values
    expected = reference_stats(values)
    absmax = expected["absmax"]
    scale = absmax if not math.isnan(absmax) and absmax > 0 else 1.0
    problems = []
    for name in FLOAT_STATS:
        if name in ("min", "max", "absmax"):
            tol = 0.0  # float32 values are exact in float64
        elif name == "l2":
            tol = RTOL * max(expected["l2"], 1e-30)
        else:
            tol = RTOL * scale
        if not same(float(row[name]), float(expected[name]), tol):
            problems.append(f"{name}: expected {expected[name]!r}, got {row[name]!r}")
    for name in EXACT_STATS:
        if not same(float(row[name]), float(expected[name]), 1e-12):
            problems.append(f"{name}: expected {expected[name]!r}, got {row[name]!r}")
    meta = {"module_type": entry.module_type, "dtype": entry.dtype, "shape": entry.shape}
    for name, value in meta.items():
        got = tuple(row[name]) if name == "shape" else row[name]
        if got != value:
            problems.append(f"{name}: expected {value!r}, got {row[name]!r}")
    if values.dtype.kind == "f":
        hist = row["hist"]
        want = reference_hist(values)
        if hist is None or not np.array_equal(np.asarray(hist), want):
            got_bins = None if hist is None else dict(sparse_bins(np.asarray(hist)))
            problems.append(f"hist: expected {dict(sparse_bins(want))}, got {got_bins}")
    elif row["hist"] is not None:
        problems.append(f"hist: expected None for {values.dtype}, got {row['hist']!r}")
    return problems


def frame_keys(frame: Any) -> list[Key]:
    return list(zip(frame.module, frame.kind, frame.tensor, frame.call, strict=True))


def check_against_reference(frame: Any, recorder: Recorder, step: int = 0) -> None:
    assert step in set(frame.step)
    frame = frame[frame.step == step]
    keys = frame_keys(frame)
    assert len(keys) == len(set(keys)), "duplicate rows"
    got, want = set(keys), set(recorder.entries)
    assert got == want, f"only in frame: {sorted(got - want)}; only in ref: {sorted(want - got)}"
    assert set(frame.phase) == {"train"}
    assert set(frame["rank"]) == {0}
    problems = []
    for key, (_, row) in zip(keys, frame.iterrows(), strict=True):
        problems += [f"{key} {line}" for line in row_mismatches(row, recorder.entries[key])]
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------- running a step


@dataclasses.dataclass
class Run:
    frame: Any
    recorders: list[Recorder]  # one per step
    grads: dict[str, np.ndarray]  # the last step's accumulated gradients, before its update

    @property
    def recorder(self) -> Recorder:
        return self.recorders[0]


def train_step(
    case: zoo.ZooModel,
    *,
    with_optimizer: bool,
    batches: tuple[tuple[Tensor, ...], ...] = (),
    steps: int = 1,
) -> Run:
    """``steps`` steps over ``batches`` (micro-batches; default one fresh batch), recorded twice.

    The first step's recorder hooks in before the scope, later ones after it: the order of the
    hooks must not matter.
    """
    model = case.model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    recorders = [Recorder(model)]
    scope = layerscope.watch(
        model, optimizer=optimizer if with_optimizer else None, every=1, kinds=KINDS
    )
    with scope:
        for index in range(steps):
            if index:
                recorders.append(Recorder(model))
            recorder = recorders[-1]
            try:
                for batch in batches or (case.make_batch(index),):
                    case.loss(model(*batch)).backward()
                recorder.read_parameters("weight_grad")
                grads = {
                    name: to_numpy(p.grad)
                    for name, p in model.named_parameters()
                    if p.grad is not None
                }
                optimizer.step()
                recorder.read_parameters("weight")
                if not with_optimizer:
                    scope.step()
                optimizer.zero_grad()
            finally:
                recorder.close()
    assert scope.failures == 0
    return Run(scope.frame(), recorders, grads)


def rows(frame: Any, module: str, kind: str, tensor: str = "out") -> Any:
    selected = frame[(frame.module == module) & (frame.kind == kind) & (frame.tensor == tensor)]
    return selected.sort_values("call").reset_index(drop=True)


def close(got: float, values: np.ndarray | Tensor) -> bool:
    """Whether a frame mean matches the float64 mean of ``values``."""
    array = values.detach().double().numpy() if isinstance(values, Tensor) else values
    return abs(got - array.mean()) <= RTOL * max(np.abs(array).max(), 1e-30)


# ---------------------------------------------------------------------------- all rows, all models


@pytest.mark.parametrize("with_optimizer", [True, False], ids=["optimizer", "scope_step"])
@pytest.mark.parametrize("name", list(zoo.ZOO))
def test_every_row_matches_the_reference(name: str, with_optimizer: bool) -> None:
    run = train_step(zoo.ZOO[name](), with_optimizer=with_optimizer)
    assert set(run.frame.kind) == set(KINDS)
    check_against_reference(run.frame, run.recorder)


@pytest.mark.parametrize("with_optimizer", [True, False], ids=["optimizer", "scope_step"])
@pytest.mark.parametrize("name", list(zoo.ZOO))
def test_later_steps_match_the_reference(name: str, with_optimizer: bool) -> None:
    run = train_step(zoo.ZOO[name](), with_optimizer=with_optimizer, steps=3)
    assert sorted(set(run.frame.step)) == [0, 1, 2]
    for step, recorder in enumerate(run.recorders):
        check_against_reference(run.frame, recorder, step)


@pytest.mark.parametrize("with_optimizer", [True, False], ids=["optimizer", "scope_step"])
@pytest.mark.parametrize("name", list(zoo.ZOO))
def test_gradient_accumulation_matches_the_reference(name: str, with_optimizer: bool) -> None:
    case = zoo.ZOO[name]()
    batches = (case.make_batch(1), case.make_batch(2))
    run = train_step(case, with_optimizer=with_optimizer, batches=batches)
    check_against_reference(run.frame, run.recorder)


# ---------------------------------------------------------------------------- which rows exist


def grouped(frame: Any) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for module, kind, tensor in zip(frame.module, frame.kind, frame.tensor, strict=True):
        out.setdefault((module, kind), set()).add(tensor)
    return out


def test_structured_outputs_are_named_by_index_key_and_field() -> None:
    frame = train_step(zoo.build_structured(), with_optimizer=True).frame
    tensors = grouped(frame)
    # probe is watched (a leaf) but returns None: no row at all
    assert set(frame.module) == {"pre", "tup", "dct", "dc", "nt", "head"}
    assert tensors["tup", "activation"] == {"out.0", "out.1.0"}  # the None inside is skipped
    assert tensors["dct", "activation"] == {"out.h", "out.extra.gate"}
    assert tensors["dc", "activation"] == {"out.value"}  # aux is None
    assert tensors["nt", "activation"] == {"out.left", "out.right"}
    assert tensors["head", "activation"] == {"out"}
    # pre's input needs no grad: an activation but no grad row
    assert ("pre", "activation") in tensors
    assert ("pre", "grad") not in tensors
    assert tensors["tup", "grad"] == {"out.0"}  # out.1.0 is tanh of pre's grad-free output
    assert tensors["dc", "weight"] == {"weight", "frozen"}
    assert tensors["dc", "weight_grad"] == {"weight"}  # frozen has no grad
    assert tensors["nt", "weight"] == {"weight", "unused"}
    assert tensors["nt", "weight_grad"] == {"weight"}  # unused has no grad


def test_selection_and_names_of_the_zoo() -> None:
    mlp = train_step(zoo.build_mlp(), with_optimizer=True).frame
    assert set(mlp.module) == {"0", "1", "2", "3", "4"}  # the Sequential root is a container
    shared = train_step(zoo.build_shared(), with_optimizer=True).frame
    assert grouped(shared)["", "weight"] == {"scale"}  # the root owns a parameter
    lstm = grouped(train_step(zoo.build_lstm(), with_optimizer=True).frame)
    assert lstm["lstm", "activation"] == {"out.0", "out.1.0", "out.1.1"}
    assert lstm["lstm", "grad"] == {"out.0", "out.1.0"}  # the cell state gets no gradient
    assert lstm["lstm", "weight"] == {"weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"}
    layer = grouped(train_step(zoo.build_transformer(), with_optimizer=True).frame)
    assert layer["self_attn", "activation"] == {"out.0"}  # (output, None) with need_weights=False
    assert layer["self_attn", "weight"] == {"in_proj_weight", "in_proj_bias"}
    # MultiheadAttention uses out_proj's weights without calling it: weights but no activation
    assert layer["self_attn.out_proj", "weight"] == {"weight", "bias"}
    assert ("self_attn.out_proj", "activation") not in layer
    assert layer["dropout", "activation"] == {"out"}


# ---------------------------------------------------------------------------- specific semantics


def test_shared_module_gets_one_row_per_call() -> None:
    case = zoo.build_shared()
    model = case.model
    (x,) = case.make_batch(0)
    with torch.no_grad():
        first = model.block(x)
        second = model.block(torch.tanh(first))
    frame = train_step(case, with_optimizer=False).frame
    for module in ("block", "act"):
        for kind in ("activation", "grad"):
            assert list(rows(frame, module, kind).call) == [0, 1], (module, kind)
    activation = rows(frame, "block", "activation")
    assert close(activation["mean"][0], first)
    assert close(activation["mean"][1], second)
    assert activation["mean"][0] != activation["mean"][1]
    # parameters are read once per step, not once per call
    assert list(rows(frame, "block", "weight", "weight").call) == [0]
    assert list(rows(frame, "block", "weight_grad", "weight").call) == [0]


def test_tied_weight_appears_under_both_owners_with_identical_stats() -> None:
    run = train_step(zoo.build_tied(), with_optimizer=True)
    frame = run.frame
    columns = [*FLOAT_STATS, *EXACT_STATS, "dtype", "shape"]
    for kind in ("weight", "weight_grad"):
        emb = rows(frame, "emb", kind, "weight")
        head = rows(frame, "head", kind, "weight")
        assert len(emb) == len(head) == 1
        assert (emb["module_type"][0], head["module_type"][0]) == ("Embedding", "Linear")
        for column in columns:
            a, b = emb[column][0], head[column][0]
            assert a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)), column
        assert np.array_equal(emb["hist"][0], head["hist"][0])
    # The gradient is the accumulated one: both the embedding's and the projection's share.
    grad = run.grads["emb.weight"]
    weight_grad = rows(frame, "emb", "weight_grad", "weight")
    assert weight_grad["numel"][0] == grad.size == 11 * 8
    assert close(weight_grad["mean"][0], grad)
    assert weight_grad["zero_frac"][0] == 0.0  # the projection's gradient touches every row


@pytest.mark.parametrize("with_optimizer", [True, False], ids=["optimizer", "scope_step"])
def test_gradient_accumulation_merges_micro_batches(with_optimizer: bool) -> None:
    case = zoo.build_mlp()
    model = case.model
    batches = (case.make_batch(1, rows=4), case.make_batch(2, rows=6))
    clones: dict[str, list[Tensor]] = {"activation": [], "grad": []}

    def hook(module: nn.Module, args: Any, output: Tensor) -> None:
        clones["activation"].append(output.detach().clone())
        output.register_hook(lambda grad: clones["grad"].append(grad.detach().clone()))

    handle = model[2].register_forward_hook(hook)
    try:
        run = train_step(case, with_optimizer=with_optimizer, batches=batches)
    finally:
        handle.remove()
    frame = run.frame
    assert set(frame.call) == {0}
    for kind in ("activation", "grad"):
        row = rows(frame, "2", kind)
        assert len(row) == 1
        parts = [part.double().numpy().reshape(-1) for part in clones[kind]]
        assert [part.size for part in parts] == [4 * 16, 6 * 16]
        joined = np.concatenate(parts)
        assert row["numel"][0] == joined.size
        tol = RTOL * np.abs(joined).max()
        assert abs(row["mean"][0] - joined.mean()) <= tol
        assert abs(row["std"][0] - joined.std(ddof=1)) <= tol
        assert row["min"][0] == joined.min()
        assert row["max"][0] == joined.max()
    weight_grad = rows(frame, "2", "weight_grad", "weight")
    assert len(weight_grad) == 1
    grad = run.grads["2.weight"]  # accumulated over both micro-batches
    assert weight_grad["numel"][0] == grad.size
    assert close(weight_grad["mean"][0], grad)
    assert weight_grad["max"][0] == grad.max()


def test_integer_and_bool_outputs_are_counts_only() -> None:
    case = zoo.build_discrete()
    (x,) = case.make_batch(0)
    with torch.no_grad():
        h = case.model.proj(x)
    expected = {
        "argmax": h.argmax(dim=-1),
        "sign": torch.sign(torch.round(h * 2)).to(torch.int32),
        "positive": h > 0,
    }
    frame = train_step(case, with_optimizer=True).frame
    for module, values in expected.items():
        row = rows(frame, module, "activation")
        assert len(row) == 1, module
        assert row["dtype"][0] == str(values.dtype).removeprefix("torch."), module
        numel = values.numel()
        assert row["numel"][0] == numel
        assert row["zero_frac"][0] == (values == 0).sum().item() / numel
        assert row["neg_frac"][0] == (values < 0).sum().item() / numel
        assert row["pos_frac"][0] == (values > 0).sum().item() / numel
        for name in FLOAT_STATS:
            assert math.isnan(row[name][0]), (module, name)
        assert (row["nan_count"][0], row["inf_count"][0]) == (0, 0)
        assert row["hist"][0] is None
        assert rows(frame, module, "grad").empty, module
    sign = rows(frame, "sign", "activation")
    assert sign["neg_frac"][0] > 0
    assert sign["zero_frac"][0] > 0
    assert sign["pos_frac"][0] > 0
    for kind in ("activation", "grad"):
        empty = rows(frame, "empty", kind)
        assert empty["numel"][0] == 0, kind
        assert tuple(empty["shape"][0]) == (7, 0)
        assert math.isnan(empty["mean"][0])
        assert math.isnan(empty["std"][0])
        assert (empty["nan_count"][0], empty["inf_count"][0]) == (0, 0)


def test_non_finite_values_are_counted_apart() -> None:
    case = zoo.build_discrete()
    (x,) = case.make_batch(0)
    with torch.no_grad():
        finite = case.model.proj(x).double().numpy()
    frame = train_step(case, with_optimizer=True).frame
    row = rows(frame, "nonfinite", "activation")
    # each of the 7 rows gains +inf, -inf, NaN, a subnormal and -0.0
    values = np.concatenate([finite.reshape(-1), np.repeat([1e-40, 0.0], 7)])
    assert row["numel"][0] == 7 * 10
    assert (row["nan_count"][0], row["inf_count"][0]) == (7, 14)
    assert close(row["mean"][0], values)
    assert row["std"][0] == pytest.approx(values.std(ddof=1), rel=RTOL)
    assert row["max"][0] == finite.max()
    assert row["zero_frac"][0] == 7 / 70  # -0.0 is zero; the subnormal is not
    assert row["neg_frac"][0] == ((finite < 0).sum() + 7) / 70  # -inf is negative
    assert row["hist"][0][255] == 21  # +-inf and NaN
    assert row["hist"][0][0] == 14  # -0.0 and the subnormal
    grad = rows(frame, "nonfinite", "grad")
    assert (grad["nan_count"][0], grad["inf_count"][0]) == (0, 0)
    assert grad["zero_frac"][0] >= 5 / 10


def test_inplace_residual_records_values_before_the_add() -> None:
    case = zoo.build_residual()
    (x,) = case.make_batch(0)
    # An out-of-place replica gives the values and gradients before each in-place add.
    replica = copy.deepcopy(case.model)
    x0 = replica.inp(x)
    x0.retain_grad()
    x1 = x0 + replica.f(x0)
    h0 = replica.g(x1)
    h0.retain_grad()
    case.loss(replica.head(h0 + x1)).backward()

    frame = train_step(case, with_optimizer=False).frame
    for module, value in (("inp", x0), ("g.1", h0)):
        activation = rows(frame, module, "activation")
        grad = rows(frame, module, "grad")
        assert close(activation["mean"][0], value), module
        assert activation["min"][0] == value.min().item(), module
        assert activation["max"][0] == value.max().item(), module
        assert close(grad["mean"][0], value.grad), module
        assert grad["max"][0] == pytest.approx(value.grad.max().item(), rel=RTOL), module
    # After the adds the tensors hold x1 = x0 + f(x0) and h0 + x1: not what was recorded.
    assert rows(frame, "inp", "activation")["max"][0] != x1.max().item()
    assert rows(frame, "g.1", "activation")["max"][0] != (h0 + x1).max().item()


def test_inplace_relu_keeps_batchnorm_output_before_relu() -> None:
    case = zoo.build_cnn()
    (x,) = case.make_batch(0)
    replica = copy.deepcopy(case.model)
    with torch.no_grad():
        normed = replica[1](replica[0](x))  # train mode: batch statistics, as in the step
    frame = train_step(case, with_optimizer=True).frame
    bn = rows(frame, "1", "activation")
    relu = rows(frame, "2", "activation")
    assert bn["neg_frac"][0] > 0  # recorded before ReLU overwrote it
    assert close(bn["mean"][0], normed)
    assert bn["min"][0] == normed.min().item()
    assert relu["neg_frac"][0] == 0.0
    assert close(relu["mean"][0], normed.clamp(min=0))
