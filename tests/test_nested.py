"""values_of and shape_of: a nested tensor is read as its components' elements, never padded."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
import pytest
import torch
from torch import Tensor, nn

import layerscope
from layerscope.hooks._values import named_tensors
from layerscope.recording._nested import shape_of, values_of
from layerscope.stats import finalize, tensor_partials

pytestmark = pytest.mark.filterwarnings(
    "ignore:The PyTorch API of nested tensors is in prototype stage:UserWarning"
)


def _components(*lengths: int, width: int = 4, dtype: torch.dtype = torch.float32) -> list[Tensor]:
    """Components of different lengths, a quarter of their elements exactly zero."""
    generator = torch.Generator().manual_seed(sum(lengths))
    out = []
    for length in lengths:
        values = torch.randn(length, width, generator=generator)
        values[torch.rand(length, width, generator=generator) < 0.25] = 0.0
        out.append(values.to(dtype))
    return out


def _strided(components: list[Tensor]) -> Tensor:
    return torch.nested.nested_tensor(components)


def _jagged(components: list[Tensor]) -> Tensor:
    return torch.nested.nested_tensor(components, layout=torch.jagged)


def _case(name: str) -> tuple[Tensor, list[Tensor]]:
    """A nested tensor of the kind ``name`` says, and the components it holds."""
    parts = _components(2, 3, 1)
    if name == "strided":
        return _strided(parts), parts
    if name == "strided, equal lengths":
        parts = _components(3, 3)
        return _strided(parts), parts
    if name == "strided, 1-D components":
        parts = [part.flatten() for part in _components(2, 5)]
        return _strided(parts), parts
    if name == "strided, bfloat16":
        parts = _components(2, 3, dtype=torch.bfloat16)
        return _strided(parts), parts
    if name == "strided, transposed":
        return _strided(parts).transpose(1, 2), [part.T for part in parts]
    # Narrowed along its components, a strided nested tensor still holds the whole buffer.
    if name == "strided, narrowed from the start":
        return _strided(parts).narrow(0, 0, 2), parts[:2]
    if name == "strided, narrowed in the middle":
        return _strided(parts).narrow(0, 1, 2), parts[1:]
    if name == "jagged":
        return _jagged(parts), parts
    if name == "jagged, transposed":
        return _jagged(parts).transpose(1, 2), [part.T for part in parts]
    if name == "jagged, narrowed":  # with lengths(): its values() hold elements it does not
        base = _components(4, width=6)[0]
        starts, lengths = [0, 1, 3, 2], [2, 3, 1, 4]
        nested = torch.nested.narrow(
            base, 1, torch.tensor(starts), torch.tensor(lengths), layout=torch.jagged
        )
        spans = zip(starts, lengths, strict=True)
        return nested, [base[row, start : start + n] for row, (start, n) in enumerate(spans)]
    raise AssertionError(name)


CASES = [
    "strided",
    "strided, equal lengths",
    "strided, 1-D components",
    "strided, bfloat16",
    "strided, transposed",
    "strided, narrowed from the start",
    "strided, narrowed in the middle",
    "jagged",
    "jagged, transposed",
    "jagged, narrowed",
]


def _reference(components: list[Tensor]) -> np.ndarray:
    """The components' elements in float64, computed apart from torch's nested code."""
    return np.concatenate([part.double().numpy().ravel() for part in components])


@pytest.mark.parametrize("case", CASES)
def test_values_are_the_components_elements(case: str) -> None:
    nested, components = _case(case)
    values = values_of(nested)
    reference = _reference(components)
    assert values.dim() == 1
    assert not values.is_nested
    assert values.layout is torch.strided
    assert values.dtype == components[0].dtype
    np.testing.assert_array_equal(np.sort(values.double().numpy()), np.sort(reference))


@pytest.mark.parametrize("case", CASES)
def test_statistics_are_those_of_the_components(case: str) -> None:
    nested, components = _case(case)
    reference = _reference(components)
    row, _ = tensor_partials(values_of(nested), None)
    stats = {name: value.item() for name, value in finalize(row[None]).items()}
    assert stats["numel"] == reference.size
    assert stats["mean"] == pytest.approx(reference.mean(), rel=1e-9)
    assert stats["std"] == pytest.approx(reference.std(ddof=1), rel=1e-9)
    assert stats["l2"] == pytest.approx(np.sqrt(np.square(reference).sum()), rel=1e-9)
    assert (stats["min"], stats["max"]) == (reference.min(), reference.max())
    assert stats["zero_frac"] == pytest.approx((reference == 0).mean(), abs=1e-12)


def test_padding_would_change_the_statistics() -> None:
    # Why values_of never pads: padded zeros are counted as the tensor's zeros.
    nested, components = _case("strided")
    padded = torch.nested.to_padded_tensor(nested, 0.0)
    reference = _reference(components)
    assert padded.numel() > reference.size
    assert (padded == 0).double().mean().item() > (reference == 0).mean() + 0.05


def test_a_plain_tensor_is_returned_after_one_attribute_check() -> None:
    class Spy(Tensor):
        calls: ClassVar[list[object]] = []

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            cls.calls.append(func)
            return super().__torch_function__(func, types, args, kwargs or {})

    plain = torch.randn(3, 4).as_subclass(Spy)
    Spy.calls.clear()
    assert values_of(plain) is plain
    assert [getattr(call, "__self__", None).__name__ for call in Spy.calls] == ["is_nested"]


@pytest.mark.parametrize(
    ("case", "shape"),
    [
        ("strided", (3, -1, 4)),
        ("strided, equal lengths", (2, 3, 4)),
        ("strided, 1-D components", (2, -1)),
        ("strided, transposed", (3, 4, -1)),
        ("strided, narrowed in the middle", (2, -1, 4)),
        ("jagged", (3, -1, 4)),
        ("jagged, transposed", (3, 4, -1)),
        ("jagged, narrowed", (4, -1)),
    ],
)
def test_shape_has_minus_one_for_ragged_dimensions(case: str, shape: tuple[int, ...]) -> None:
    nested, _ = _case(case)
    assert shape_of(nested) == shape
    assert all(type(size) is int for size in shape_of(nested))  # not a symbolic nested int


def test_shape_of_an_empty_nested_tensor_and_of_plain_tensors() -> None:
    assert shape_of(torch.nested.nested_tensor([])) == (0,)
    assert values_of(torch.nested.nested_tensor([])).numel() == 0
    assert shape_of(torch.ones(2, 3)) == (2, 3)
    assert shape_of(torch.tensor(1.0)) == ()
    assert type(shape_of(torch.ones(2, 3))) is tuple


@pytest.mark.cuda
def test_no_host_sync_on_cuda() -> None:
    parts = [part.cuda() for part in _components(2, 3, 1)]
    nested = [
        _strided(parts),
        _strided(parts).narrow(0, 1, 2),  # copied component by component
        _strided(parts).transpose(1, 2),
        _jagged(parts),
        _jagged(parts).transpose(1, 2),
    ]
    plain = torch.randn(8, 4, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        assert values_of(plain) is plain
        read = [(values_of(tensor), shape_of(tensor)) for tensor in nested]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    expected = [parts, parts[1:], parts, parts, parts]
    for (values, _), components in zip(read, expected, strict=True):
        assert values.is_cuda
        reference = _reference([part.cpu() for part in components])
        np.testing.assert_array_equal(np.sort(values.double().cpu().numpy()), np.sort(reference))
    assert [shape for _, shape in read] == [
        (3, -1, 4), (2, -1, 4), (3, 4, -1), (3, -1, 4), (3, 4, -1)
    ]  # fmt: skip


@dataclasses.dataclass(eq=False)
class _Tagged(Tensor):
    """A tensor subclass that is a dataclass too: walking its fields would lose the tensor."""

    tag: str = "tagged"


def test_named_tensors_keeps_nested_tensors_and_subclasses_whole() -> None:
    two_tensor = pytest.importorskip("torch.testing._internal.two_tensor")
    tensors = {
        "out.0": _case("strided")[0],
        "out.1.jagged": _case("jagged")[0],
        "out.1.weight": nn.Parameter(torch.ones(2)),
        "out.2.0": torch.ones(2).as_subclass(_Tagged),
        "out.2.1": two_tensor.TwoTensor(torch.ones(2), torch.zeros(2)),  # a wrapper, as DTensor
    }
    output = (
        tensors["out.0"],
        {"jagged": tensors["out.1.jagged"], "weight": tensors["out.1.weight"]},
        [tensors["out.2.0"], tensors["out.2.1"]],
    )
    found = list(named_tensors(output, "out"))
    assert [name for name, _ in found] == list(tensors)
    assert all(tensor is tensors[name] for name, tensor in found)


# Watching models that make nested tensors: the recorder reads them through values_of and
# shape_of.


def test_transformer_encoder_fast_path_is_read_without_its_padding() -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 2).eval()
    batch = torch.randn(3, 5, 16)
    padding = torch.zeros(3, 5, dtype=torch.bool)
    padding[0, 3:] = True
    padding[1, 1:] = True  # kept: 3, 1 and 5 positions
    seen: dict[str, Tensor] = {}
    dropout = encoder.layers[0].dropout1  # the attention block's output, nested here
    dropout.register_forward_hook(lambda module, args, out: seen.setdefault("out", out))
    with layerscope.watch(encoder, every=1, kinds=("activation", "input")) as scope:
        with torch.no_grad():
            encoder(batch, src_key_padding_mask=padding)
        scope.step()
    assert seen["out"].is_nested  # the fast path ran
    assert scope.failures == 0
    frame = scope.frame()
    row = frame[(frame.module == "layers.0.dropout1") & (frame.kind == "activation")]
    reference = _reference(list(seen["out"].unbind()))
    assert reference.size == (3 + 1 + 5) * 16
    assert row.numel.tolist() == [reference.size]
    assert row["shape"].tolist() == [(3, -1, 16)]
    assert row["mean"].item() == pytest.approx(reference.mean(), rel=1e-6)
    assert row["std"].item() == pytest.approx(reference.std(ddof=1), rel=1e-6)
    assert row["absmax"].item() == pytest.approx(np.abs(reference).max(), rel=1e-6)
    # MultiheadAttention.forward(query, key, value, ...): the first argument is its query.
    nested_input = frame.query("module == 'layers.1.self_attn' and tensor == 'in.query'")
    assert nested_input.numel.tolist() == [reference.size]


def test_jagged_activations_gradients_and_sentinel_in_training() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    outputs: list[Tensor] = []
    model[0].register_forward_hook(lambda module, args, out: outputs.append(out.detach()))
    schedule = layerscope.Schedule(every=2, dense=0, sentinel=True)  # step 1: the sentinel's
    watch = layerscope.watch(
        model, optimizer=optimizer, every=schedule, kinds=("activation", "grad")
    )
    with watch as scope:
        for _ in range(2):
            model(_jagged(_components(2, 5, 1))).values().pow(2).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    assert scope.failures == 0
    frame = scope.frame().query("module == '0' and kind == 'activation'").sort_values("step")
    assert frame.step.tolist() == [0, 1]
    assert frame.sentinel.tolist() == [False, True]
    for (_, row), output in zip(frame.iterrows(), outputs, strict=True):
        reference = _reference(list(output.unbind()))
        assert row["numel"] == reference.size == 8 * 3
        assert row["shape"] == (3, -1, 3)
        assert (row["min"], row["max"]) == pytest.approx((reference.min(), reference.max()))
    grads = scope.frame().query("kind == 'grad' and step == 0")
    assert sorted(grads.module) == ["0", "1"]
    assert set(grads.numel) == {24}
