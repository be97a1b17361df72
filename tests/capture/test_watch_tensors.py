"""watch(tensors=...): whole tensors kept in the run, equal to an independent hook's, bounded."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

import layerscope

pytest.importorskip("safetensors")


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    # In-place ReLU after the chosen layer: its output changes after the hook has run.
    return nn.Sequential(nn.Linear(5, 7), nn.ReLU(inplace=True), nn.Linear(7, 3))


def _train(
    model: nn.Module, steps: int, scope: layerscope.Scope | _Reference | None = None
) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(6, 5, generator=generator)
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        if scope is not None:  # watch() was given no optimizer: steps end at scope.step()
            scope.step()


class _Reference:
    """What an independent forward hook and tensor hook see of layer 0, and its weights."""

    def __init__(self, layer: nn.Module, every: int) -> None:
        self.layer, self.every = layer, every
        self.at = 0
        self.seen: dict[tuple[int, str, str], Tensor] = {}
        layer.register_forward_hook(self._hook)

    def _hook(self, module: nn.Module, args: object, out: Tensor) -> None:
        if self.at % self.every:
            return
        at, seen = self.at, self.seen
        seen[(at, "activation", "out")] = out.detach().clone()
        out.register_hook(lambda grad: seen.__setitem__((at, "grad", "out"), grad.clone()))

    def step(self) -> None:
        if self.at % self.every == 0:
            self.seen[(self.at, "weight", "weight")] = self.layer.weight.detach().clone()
            self.seen[(self.at, "weight", "bias")] = self.layer.bias.detach().clone()
        self.at += 1


def _reference(steps: int, every: int) -> dict[tuple[int, str, str], Tensor]:
    model = _model()
    reference = _Reference(model[0], every)
    _train(model, steps, reference)
    return reference.seen


@pytest.mark.parametrize("stored", [False, True])
def test_values_equal_an_independent_hook_at_the_kept_steps(tmp_path: Path, stored: bool) -> None:
    model = _model()
    run = tmp_path / "run" if stored else None
    tensors = {"include": r"^0$", "kinds": ("activation", "grad", "weight"), "every": 3}
    with layerscope.watch(model, run=run, every=2, tensors=tensors) as scope:
        _train(model, 7, scope)
    records = (layerscope.load(run) if run else scope).tensors.records
    expected = _reference(7, 3)
    got = {(r.step, r.kind, r.tensor): r for r in records}
    assert sorted(got) == sorted(expected)
    for key, value in expected.items():
        record = got[key]
        assert torch.equal(record.value, value), key
        assert record.module == "0"
        assert record.type == "Linear"
        assert record.phase == "train"
        assert record.value.grad_fn is None
        assert not record.value.requires_grad
        storage = record.value.untyped_storage().nbytes()
        assert storage == record.value.numel() * record.value.element_size()


def test_the_default_steps_are_those_that_record_statistics(tmp_path: Path) -> None:
    model = _model()
    with layerscope.watch(model, run=tmp_path / "run", every=4, tensors=r"^2$") as scope:
        _train(model, 9, scope)
    run = layerscope.load(tmp_path / "run")
    kept = sorted({r.step for r in run.tensors})
    assert kept == sorted(run.stats.step.unique().tolist()) == [0, 4, 8]
    assert {(r.kind, r.tensor) for r in run.tensors} == {("activation", "out"), ("grad", "out")}
    assert run.meta["config"]["tensors"]["include"] == ["^2$"]


def test_the_run_files_read_back_as_the_scope_saw_them(tmp_path: Path) -> None:
    model = _model()
    with layerscope.watch(model, run=tmp_path / "run", every=1, tensors=r"^0$") as scope:
        _train(model, 3, scope)
        live = scope.tensors.records  # while the scope is open: what was written so far
    loaded = layerscope.load_capture(tmp_path / "run" / "tensors").records
    assert len(live) == len(loaded) == 6
    for a, b in zip(live, loaded, strict=True):
        assert a.metadata() == b.metadata()
        assert torch.equal(a.value, b.value)
    assert sorted(p.name for p in (tmp_path / "run" / "tensors").iterdir()) == [
        f"part-{n:06d}.safetensors" for n in (1, 2, 3)
    ]


def test_training_is_bit_identical_with_and_without_tensors() -> None:
    plain, watched = _model(), _model()
    _train(plain, 5)
    with layerscope.watch(watched, every=1, tensors={"include": ".", "kinds": "activation"}):
        _train(watched, 5)
    for a, b in zip(plain.parameters(), watched.parameters(), strict=True):
        assert torch.equal(a, b)


def test_hooks_come_off_between_kept_steps_and_at_close() -> None:
    model = _model()
    layer = model[0]
    tensors = {"include": "^0$", "every": 3}
    scope = layerscope.watch(model, every=1, kinds=("weight",), tensors=tensors)

    def capture_hooks() -> int:
        hooks = layer._forward_hooks.values()
        return sum("Capture" in hook.__qualname__ for hook in hooks)

    counts = [capture_hooks()]
    for _ in range(3):
        _train(model, 1, scope)
        counts.append(capture_hooks())
    # Step 0 keeps; the hooks stay through step 1, where step 0's evaluation may come; off in
    # step 2; on again for step 3.
    assert counts == [1, 1, 0, 1]
    _train(model, 1, scope)
    scope.close()
    assert len(layer._forward_hooks) == 0
    assert len(layer._forward_pre_hooks) == 0
    assert {r.step for r in scope.tensors} == {0, 3}


def test_max_bytes_bounds_what_is_kept_over_many_steps() -> None:
    model = _model()
    one_step = 2 * 6 * 7 * 4  # an activation and a gradient of (6, 7) float32
    tensors = {"include": "^0$", "every": 1, "max_bytes": 10 * one_step}
    warns = pytest.warns(layerscope.LayerscopeWarning, match="max_bytes")
    with warns, layerscope.watch(model, every=1000, tensors=tensors) as scope:
        _train(model, 1000, scope)
    kept = scope.tensors.records
    assert sum(r.value.numel() * r.value.element_size() for r in kept) <= 10 * one_step
    assert {r.step for r in kept} == set(range(10))
    assert scope.tensors_dropped == 2 * 990


def test_evaluation_after_a_step_is_kept_under_that_step() -> None:
    model = _model()
    with layerscope.watch(
        model, every=1, tensors={"include": "^0$", "kinds": "activation"}
    ) as scope:
        _train(model, 2, scope)
        model.eval()
        with torch.no_grad():
            model(torch.ones(2, 5))
        model.train()
        _train(model, 1, scope)
    evals = [r for r in scope.tensors if r.phase == "eval"]
    assert [(r.step, tuple(r.value.shape)) for r in evals] == [(1, (2, 7))]


def test_stash_value_maps_each_tensor_first() -> None:
    model = _model()
    tensors = {"include": "^0$", "kinds": "activation", "stash_value": lambda t: t.std(dim=0)}
    with layerscope.watch(model, every=1, tensors=tensors) as scope:
        _train(model, 2, scope)
    assert [tuple(r.value.shape) for r in scope.tensors] == [(7,), (7,)]


@pytest.mark.parametrize(
    ("tensors", "error", "message"),
    [
        (3, TypeError, "tensors: expected a regex"),
        ({"include": "0", "colour": 1}, ValueError, "unknown key 'colour'"),
        ({"kinds": "activation"}, ValueError, "name the modules"),
        ({"include": "0", "kinds": "update"}, ValueError, "kinds: unknown kind 'update'"),
        ({"include": "0", "every": 0}, ValueError, "every: expected an int >= 1"),
        ({"include": "0", "keep": "yes"}, TypeError, "keep: expected True or False"),
        ({"include": "(", "kinds": "activation"}, ValueError, "tensors: include"),
        ({"include": "^nothing$"}, ValueError, "tensors: include/exclude/types"),
    ],
)
def test_bad_tensors_arguments_name_what_is_wrong(
    tensors: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        layerscope.watch(_model(), tensors=tensors)  # type: ignore[arg-type]


def test_on_tensor_needs_tensors() -> None:
    with pytest.raises(ValueError, match="on_tensor: needs tensors="):
        layerscope.watch(_model(), on_tensor=print)


def test_on_tensor_renders_what_the_run_keeps_in_a_worker(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from PIL import Image

    from layerscope.tensors import HeatMap

    model = _model()
    run = tmp_path / "run"
    tensors = {"include": "^0$", "kinds": "weight"}
    scope = layerscope.watch(model, run=run, every=1, tensors=tensors, on_tensor=HeatMap())
    workers = scope._whole.workers  # type: ignore[union-attr]
    assert workers is not None
    pids = workers.pids()
    _train(model, 3, scope)
    scope.close()  # waits for the worker to draw what it was given
    drawn = sorted((run / "renders" / "heatmap").rglob("*.png"))
    given = 2 * 3 - scope.on_tensor_dropped  # weight and bias of 3 steps
    assert len(drawn) == workers.processed == given >= 1
    with Image.open(drawn[0]) as image:
        assert image.size[0] > 100
    assert len(layerscope.load(run).tensors) == 6  # kept in the run all the same
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            _alive(pid)


def _alive(pid: int) -> None:
    """Raise ProcessLookupError unless ``pid`` is a live (not zombie) process."""
    import os

    os.kill(pid, 0)
    status = Path(f"/proc/{pid}/status")
    if status.exists() and "zombie" in status.read_text():
        raise ProcessLookupError(pid)


def _evaluate(model: nn.Module) -> None:
    model.eval()
    with torch.no_grad():
        model(torch.ones(2, 5))
    model.train()


def test_the_evaluation_of_a_kept_step_is_kept_and_no_other() -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tensors = {"include": "^0$", "kinds": "activation", "every": 2}
    with layerscope.watch(model, optimizer, every=1, tensors=tensors) as scope:
        for _ in range(5):
            model(torch.randn(6, 5)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            _evaluate(model)  # after the step: it belongs to the step that just ended
        _evaluate(model)  # a second one in the same place: its call is 1
        model(torch.randn(6, 5)).pow(2).mean().backward()
        _evaluate(model)  # in the middle of step 5: call 0 of step 5, not kept (5 is odd)
    kept = [(r.step, r.phase, r.call) for r in scope.tensors]
    assert kept == [
        (0, "train", 0),
        (0, "eval", 0),
        (2, "train", 0),
        (2, "eval", 0),
        (4, "train", 0),
        (4, "eval", 0),
        (4, "eval", 1),
    ]


def test_a_failure_at_the_end_of_a_step_is_counted_and_training_goes_on() -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # A value on the meta device cannot be copied to the host: the step's end fails.
    tensors = {"include": "^0$", "kinds": "activation", "stash_value": lambda t: t.to("meta")}
    warns = pytest.warns(layerscope.LayerscopeWarning, match="whole tensors")
    with warns, layerscope.watch(model, optimizer, every=1, tensors=tensors) as scope:
        for _ in range(3):
            model(torch.randn(6, 5)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    assert scope.current_step == 3
    assert scope.failures == 3
    assert scope.tensors_dropped == 3
    assert "skipped" not in set(scope.frame("scalars").name)


def test_a_failing_stash_value_is_one_of_the_scope_s_failures() -> None:
    model = _model()

    def broken(tensor: Tensor) -> Tensor:
        raise RuntimeError("no")

    tensors = {"include": "^0$", "stash_value": broken}
    warns = pytest.warns(layerscope.LayerscopeWarning, match="no")
    with warns, layerscope.watch(model, every=1, tensors=tensors) as scope:
        _train(model, 2, scope)
    assert scope.failures == 4  # an activation and a gradient a step
    assert len(scope.tensors) == 0


def test_a_reentrant_checkpointed_forward_is_a_training_pass() -> None:
    from torch.utils.checkpoint import checkpoint

    class Checkpointed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = nn.Sequential(nn.Linear(5, 7), nn.ReLU())
            self.head = nn.Linear(7, 1)

        def forward(self, x: Tensor) -> Tensor:
            return self.head(checkpoint(self.block, x, use_reentrant=True))

    model = Checkpointed()
    tensors = {"include": r"^block\.0$", "kinds": "activation"}
    with layerscope.watch(model, every=1, tensors=tensors) as scope:
        x = torch.randn(6, 5, requires_grad=True)
        model(x).sum().backward()
        scope.step()
    assert [(r.step, r.phase, r.call) for r in scope.tensors] == [(0, "train", 0)]


def test_load_capture_reads_a_run_s_tensors_at_an_fsspec_url() -> None:
    fsspec = pytest.importorskip("fsspec")
    model = _model()
    root = f"layerscope-tensors-{uuid.uuid4().hex}"  # the memory filesystem is the process's
    url = f"memory://{root}/run"
    try:
        with layerscope.watch(model, run=url, every=1, tensors="^0$") as scope:
            _train(model, 2, scope)
        loaded = layerscope.load_capture(f"{url}/tensors")
        assert [(r.step, r.kind) for r in loaded] == [(r.step, r.kind) for r in scope.tensors]
        assert len(loaded) == 4
    finally:
        fsspec.filesystem("memory").rm(f"/{root}", recursive=True)
