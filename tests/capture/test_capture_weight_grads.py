"""kinds "weight_grad": each parameter's gradient as the optimizer sees it, one per step."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

import layerscope


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.ReLU(inplace=True), nn.Linear(7, 3))


def _batches(count: int) -> list[Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(6, 5, generator=generator) for _ in range(count)]


def _grads(model: nn.Module, names: tuple[str, ...]) -> dict[tuple[str, str], Tensor]:
    """The gradients of the named modules' own parameters, cloned by hand."""
    modules = dict(model.named_modules())
    return {
        (name, tensor): param.grad.clone()
        for name in names
        for tensor, param in modules[name].named_parameters(recurse=False)
        if param.grad is not None
    }


def _kept(records) -> dict[tuple[int, str, str], Tensor]:
    kept = {}
    for record in records:
        if record.kind == "weight_grad":
            key = (record.step, record.module, record.tensor)
            assert key not in kept, f"two readings of {key}"
            kept[key] = record.value
    return kept


def _assert_equal(kept: dict, expected: dict) -> None:
    assert sorted(kept) == sorted(expected)
    for key, value in expected.items():
        assert torch.equal(kept[key], value), key


def test_without_an_optimizer_each_step_keeps_the_gradient_backward_left():
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    expected = {}
    with layerscope.capture(model, include=r"^(0|2)$", kinds=("weight_grad",)) as cap:
        for step, x in enumerate(_batches(3)):
            model(x).pow(2).mean().backward()
            for (name, tensor), grad in _grads(model, ("0", "2")).items():
                expected[(step, name, tensor)] = grad
            optimizer.step()
            optimizer.zero_grad()
            cap.step()
    _assert_equal(_kept(cap.records), expected)
    assert cap.hooks == 0
    assert {r.phase for r in cap.records} == {"train"}
    assert {r.type for r in cap.records} == {"Linear"}


def test_with_gradient_accumulation_the_step_keeps_the_accumulated_gradient():
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = _batches(6)
    expected = {}
    with layerscope.capture(model, include=r"^0$", kinds=("weight_grad", "activation")) as cap:
        for step in range(2):
            for x in batches[3 * step : 3 * step + 3]:  # three micro-batches
                (model(x).pow(2).mean() / 3).backward()
            for (name, tensor), grad in _grads(model, ("0",)).items():
                expected[(step, name, tensor)] = grad
            optimizer.step()
            optimizer.zero_grad()
            cap.step()
    _assert_equal(_kept(cap.records), expected)
    # The first micro-batch's gradient alone is not what was kept.
    model_again = _model()
    (model_again(batches[0]).pow(2).mean() / 3).backward()
    assert not torch.equal(model_again[0].weight.grad, expected[(0, "0", "weight")])
    assert sum(r.kind == "activation" for r in cap.records) == 6


def test_with_an_optimizer_the_gradient_is_read_after_clipping():
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    expected, unclipped = {}, {}
    with layerscope.capture(model, include=r"^0$", kinds="weight_grad", optimizer=optimizer) as cap:
        for step, x in enumerate(_batches(3)):
            (model(x).pow(2).mean() * 100).backward()
            unclipped.update({(step, *key): g for key, g in _grads(model, ("0",)).items()})
            nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.01)
            expected.update({(step, *key): g for key, g in _grads(model, ("0",)).items()})
            optimizer.step()
            optimizer.zero_grad()
            cap.step()
    _assert_equal(_kept(cap.records), expected)
    assert not torch.equal(unclipped[(0, "0", "weight")], expected[(0, "0", "weight")])


def test_a_closure_step_keeps_the_gradient_of_its_last_closure_call():
    model = _model()
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=3)
    x = _batches(1)[0]
    last: dict = {}

    def closure() -> Tensor:
        optimizer.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        last.update(_grads(model, ("2",)))
        return loss

    with layerscope.capture(model, include="^2$", kinds="weight_grad", optimizer=optimizer) as cap:
        optimizer.step(closure)
        cap.step()
    _assert_equal(_kept(cap.records), {(0, *key): grad for key, grad in last.items()})


def test_stash_value_and_condition_apply_to_weight_gradients():
    model = _model()
    with layerscope.capture(
        model,
        include="^0$",
        kinds="weight_grad",
        condition=lambda record: record.tensor == "weight",
        stash_value=lambda grad: grad.abs().max(),
    ) as cap:
        model(_batches(1)[0]).sum().backward()
        expected = model[0].weight.grad.abs().max()
    assert [(r.tensor, r.kind) for r in cap.records] == [("weight", "weight_grad")]
    assert torch.equal(cap.records[0].value, expected)  # kept at close, the step in progress


def test_every_reads_gradients_of_the_kept_steps_only_with_no_hook_between():
    model = _model()
    hooks = []
    with layerscope.capture(model, include="^0$", kinds="weight_grad", every=2) as cap:
        for x in _batches(4):
            hooks.append(cap.hooks)
            model(x).sum().backward()
            model.zero_grad()
            cap.step()
    assert sorted({r.step for r in cap.records}) == [0, 2]
    assert hooks == [2, 0, 2, 0]  # the weight's and the bias's accumulation hooks


def test_weight_grad_inside_watch_equals_the_gradient_the_optimizer_steps_with():
    pytest.importorskip("safetensors")
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    expected = {}
    tensors = {"include": "^2$", "kinds": ["weight_grad"], "every": 1}
    with layerscope.watch(model, optimizer, every=2, tensors=tensors) as scope:
        for step, x in enumerate(_batches(3)):
            (model(x).pow(2).mean() * 100).backward()
            nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.01)
            expected.update({(step, *key): g for key, g in _grads(model, ("2",)).items()})
            optimizer.step()
            optimizer.zero_grad()
    _assert_equal(_kept(scope.tensors.records), expected)


def test_weight_grad_inside_watch_without_an_optimizer_is_read_when_backward_ends():
    pytest.importorskip("safetensors")
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    expected = {}
    tensors = {"include": "^0$", "kinds": ["weight_grad", "activation"], "every": 2}
    with layerscope.watch(model, tensors=tensors) as scope:
        for step, x in enumerate(_batches(4)):
            model(x).pow(2).mean().backward()
            if step % 2 == 0:
                expected.update({(step, *key): g for key, g in _grads(model, ("0",)).items()})
            optimizer.step()
            optimizer.zero_grad()
            scope.step()
    _assert_equal(_kept(scope.tensors.records), expected)


def test_weight_grad_is_a_kind_of_capture_and_of_tensors_but_update_is_not():
    model = _model()
    with pytest.raises(ValueError, match=r"kinds: unknown kind 'update'.*weight_grad"):
        layerscope.capture(model, kinds=("update",))
    with pytest.raises(ValueError, match="tensors: kinds: unknown kind 'update'"):
        layerscope.watch(model, tensors={"include": "^0$", "kinds": ["update"]})
    with pytest.raises(TypeError, match="optimizer"):
        layerscope.capture(model, kinds="weight_grad", optimizer="sgd")


@pytest.mark.slow  # one torchrun launch
def test_under_ddp_the_gradient_kept_is_the_all_reduced_one(tmp_path):
    from tests.distributed.conftest import HERE, launch

    script = HERE.parent / "capture" / "ddp_weight_grads_script.py"
    job = launch(str(script), tmp_path)
    job.assert_succeeded()
    results = job.ranks("rank")
    for result in results:
        assert len(result["equal_by_hand"]) == 4
        assert all(result["equal_by_hand"])
        assert all(result["watched_equal"])
        assert not any(result["equal_local"])  # each rank's own gradient is not it
    assert results[0]["captured"] == results[1]["captured"]
