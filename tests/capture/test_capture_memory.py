"""condition, reduction and max_bytes keep memory bounded, and reductions are exact."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import layerscope
from layerscope import LayerscopeWarning

STEPS = 1000


def _tiny() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))


def _train(model: nn.Module, cap, steps: int = STEPS) -> list[torch.Tensor]:
    """Run ``steps`` forward and backward passes; the first layer's outputs, as seen here."""
    generator = torch.Generator().manual_seed(1)
    outputs = []
    for _ in range(steps):
        x = torch.randn(5, 3, generator=generator)
        # The first layer's output, computed here without calling the hooked module.
        outputs.append(F.linear(x, model[0].weight, model[0].bias).detach())
        model(x).pow(2).mean().backward()
        cap.step()
    return outputs


def _total_bytes(cap) -> int:
    return sum(r.value.untyped_storage().nbytes() for r in cap.records)


@pytest.mark.parametrize("name", ["sum", "mean", "max", "min"])
def test_builtin_reductions_keep_one_tensor_per_key_and_match_float64(name):
    model = _tiny()
    with layerscope.capture(model, include="^0$", kinds="activation", reduction=name) as cap:
        generator = torch.Generator().manual_seed(1)
        seen = []
        for step in range(STEPS):
            x = torch.randn(5, 3, generator=generator)
            with torch.no_grad():
                seen.append(F.linear(x.double(), model[0].weight.double(), model[0].bias.double()))
            model(x)
            cap.step()
            if step == 10:
                early = _total_bytes(cap)
    (record,) = cap.records
    assert record.count == STEPS
    assert record.step == STEPS - 1
    assert _total_bytes(cap) == early == cap.bytes == 5 * 4 * 4
    stacked = torch.stack(seen)  # (steps, 5, 4)
    expected = {
        "sum": stacked.sum(0),
        "mean": stacked.mean(0),
        "max": stacked.amax(0),
        "min": stacked.amin(0),
    }[name]
    assert record.value.dtype == torch.float32
    torch.testing.assert_close(record.value.double(), expected, rtol=1e-5, atol=1e-5)


def test_a_callable_reduction_folds_like_functools_reduce():
    model = _tiny()
    with layerscope.capture(
        model, include="^0$", kinds="activation", reduction=lambda acc, new: acc * 0.5 + new
    ) as cap:
        outputs = _train(model, cap, steps=50)
    expected = outputs[0]
    for value in outputs[1:]:
        expected = expected * 0.5 + value
    (record,) = cap.records
    assert record.count == 50
    torch.testing.assert_close(record.value, expected)


def test_a_callable_returning_the_new_tensor_keeps_a_copy_not_the_models_tensor():
    model = nn.Linear(2, 2)
    with layerscope.capture(model, kinds="activation", reduction=lambda acc, new: new) as cap:
        model(torch.randn(1, 2))
        out = model(torch.randn(1, 2))
        out.mul_(0)  # the model's tensor changes later
    assert (cap.records[0].value != 0).all()
    assert cap.records[0].value.grad_fn is None


def test_low_precision_sums_and_means_accumulate_in_float32():
    model = nn.Linear(8, 8).to(torch.bfloat16)
    with layerscope.capture(model, kinds="activation", reduction="mean") as cap:
        seen = []
        for _ in range(200):
            x = torch.randn(4, 8, dtype=torch.bfloat16)
            seen.append(model(x).detach().double())
            cap.step()
    (record,) = cap.records
    assert record.value.dtype == torch.float32
    torch.testing.assert_close(record.value.double(), torch.stack(seen).mean(0), atol=1e-5, rtol=0)


def test_a_shape_change_under_a_reduction_warns_once_and_is_counted():
    model = nn.Linear(2, 2)
    with layerscope.capture(model, kinds="activation", reduction="sum") as cap:
        model(torch.randn(3, 2))
        with pytest.warns(LayerscopeWarning, match="shape changed"):
            model(torch.randn(4, 2))
        model(torch.randn(5, 2))  # counted, not warned again
    assert cap.failures == 2
    assert cap.records[0].count == 1


def test_condition_gates_on_the_records_metadata():
    model = _tiny()
    with layerscope.capture(
        model, condition=lambda r: r.step % 100 == 0 and r.module == "2"
    ) as cap:
        _train(model, cap)
    assert [(r.step, r.kind) for r in cap.records[:2]] == [(0, "activation"), (0, "grad")]
    assert len(cap.records) == 2 * STEPS // 100
    assert _total_bytes(cap) == cap.bytes == len(cap.records) * 5 * 4


def test_condition_can_gate_on_outside_state():
    model = _tiny()
    wanted = {"on": False}
    with layerscope.capture(model, include="^0$", condition=lambda _: wanted["on"]) as cap:
        model(torch.randn(2, 3))
        wanted["on"] = True
        model(torch.randn(2, 3))
    assert [r.call for r in cap.records] == [1]


def test_max_bytes_stops_keeping_with_one_warning_and_counts_what_was_skipped():
    model = _tiny()
    per_step = 5 * 4 * 4 + 5 * 4 * 4  # activation and gradient of layer 0, float32
    limit = 10 * per_step + 3
    cap = layerscope.capture(model, include="^0$", max_bytes=limit)
    with cap, pytest.warns(LayerscopeWarning, match="max_bytes") as caught:
        _train(model, cap)
    assert len([w for w in caught if issubclass(w.category, LayerscopeWarning)]) == 1
    assert _total_bytes(cap) == cap.bytes == 10 * per_step <= limit
    assert len(cap.records) == 20
    assert cap.skipped == 2 * STEPS - 20
    cap.clear()
    assert cap.bytes == 0
    assert cap.records == []


def test_unbounded_capture_grows_by_exactly_the_values_kept():
    model = _tiny()
    with layerscope.capture(model, include="^2$", kinds="activation") as cap:
        _train(model, cap, steps=100)
    assert len(cap.records) == 100
    assert _total_bytes(cap) == cap.bytes == 100 * 5 * 1 * 4
