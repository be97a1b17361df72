"""The per-step sentinel: min and max of every watched activation and gradient between
recorded steps, checked against plain hooks in float64."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import layerscope
from layerscope import Schedule


class Poisoned(nn.Module):
    """Adds ``value`` at step ``at``: a NaN or an Inf appears there, and spreads from there."""

    def __init__(self, value: float, at: int) -> None:
        super().__init__()
        self.value, self.at, self.step = value, at, 0

    def forward(self, x):
        return x + self.value if self.step == self.at else x


def _model(poison: Poisoned | None = None) -> nn.Sequential:
    torch.manual_seed(0)
    layers = [nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3)]
    if poison is not None:
        layers.insert(2, poison)
    return nn.Sequential(*layers)


class Reference:
    """Float64 min and max of each module's output and output gradient, per step."""

    def __init__(self, model: nn.Module) -> None:
        self.values: dict[tuple[int, str, str], list[np.ndarray]] = {}
        self.step = 0
        for name, module in model.named_modules():
            if name:
                module.register_forward_hook(self._forward(name))

    def _keep(self, name: str, kind: str, tensor: torch.Tensor) -> None:
        values = tensor.detach().double().numpy().ravel()
        self.values.setdefault((self.step, name, kind), []).append(values)

    def _forward(self, name: str):
        def hook(module, args, output):
            if torch.is_grad_enabled():
                self._keep(name, "activation", output)
                output.register_hook(lambda grad: self._keep(name, "grad", grad))

        return hook

    def rows(self) -> dict[tuple[int, str, str], tuple[float, float, int]]:
        """min, max (NaN wins, as in the sentinel) and numel of each step, module and kind."""
        out = {}
        for key, pieces in self.values.items():
            values = np.concatenate(pieces)
            out[key] = (values.min(), values.max(), values.size)
        return out


def _train(model, scope, steps, reference=None, poison=None, micro_batches=1, dtype=None):
    generator = torch.Generator().manual_seed(1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(steps):
        if poison is not None:
            poison.step = step
        if reference is not None:
            reference.step = step
        for _ in range(micro_batches):
            x = torch.randn(5, 6, generator=generator).to(dtype or torch.float32)
            model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        scope.step()


@pytest.mark.parametrize(
    ("micro_batches", "dtype"),
    [(1, torch.float32), (3, torch.float32), (1, torch.bfloat16), (2, torch.float64)],
)
def test_sentinel_rows_match_float64_min_and_max(micro_batches, dtype):
    # float32 and bfloat16 are read by the C kernel, float64 by torch.aminmax
    model = _model().to(dtype)
    reference = Reference(model)
    with layerscope.watch(model, every=Schedule(every=4, sentinel=True)) as scope:
        _train(model, scope, steps=6, reference=reference, micro_batches=micro_batches, dtype=dtype)
    frame = scope.frame()
    sentinel = frame[frame.sentinel]
    assert sorted(set(sentinel.step)) == [1, 2, 3, 5]
    assert set(sentinel.kind) == {"activation", "grad"}
    assert sentinel["mean"].isna().all()
    assert sentinel["hist"].isna().all()
    assert sentinel.nan_count.isna().all()
    assert not frame[~frame.sentinel]["mean"].isna().any()
    # one row per step, module and kind: micro-batches merged
    assert not sentinel.duplicated(["step", "module", "kind", "tensor", "call"]).any()
    expected = {key: value for key, value in reference.rows().items() if key[0] in (1, 2, 3, 5)}
    assert len(sentinel) == len(expected)
    for row in sentinel.itertuples():
        low, high, numel = expected[(row.step, row.module, row.kind)]
        # their min and max are exact in float64
        assert row.min == low
        assert row.max == high
        assert row.absmax == max(abs(low), abs(high))
        assert row.numel == numel


def test_a_step_whose_sentinel_readings_are_flushed_in_pieces_keeps_one_row_each(monkeypatch):
    # Very many forwards in a step flush its sentinel readings before the step ends; the
    # writer, finishing every batch at once, must still merge each step's pieces into one row.
    monkeypatch.setattr(layerscope.writer._pipeline, "WAITING_BATCHES", 1)
    model = _model()
    reference = Reference(model)
    with layerscope.watch(model, every=Schedule(every=100, sentinel=True)) as scope:
        scope._recorder.rows_per_flush = 5
        _train(model, scope, steps=4, reference=reference, micro_batches=3)
    sentinel = scope.frame().query("sentinel")
    assert not sentinel.duplicated(["step", "module", "kind", "tensor", "call"]).any()
    expected = {key: value for key, value in reference.rows().items() if key[0] in (1, 2, 3)}
    assert len(sentinel) == len(expected)
    for row in sentinel.itertuples():
        low, high, numel = expected[(row.step, row.module, row.kind)]
        assert (row.min, row.max, row.numel) == (low, high, numel)


@pytest.mark.parametrize(
    ("poison_value", "check"), [(math.nan, math.isnan), (math.inf, math.isinf)]
)
def test_a_non_finite_value_between_recorded_steps_shows_where_and_when(poison_value, check):
    poison = Poisoned(poison_value, at=3)
    model = _model(poison)
    with layerscope.watch(model, every=Schedule(every=10, sentinel=True)) as scope:
        _train(model, scope, steps=5, poison=poison)
    frame = scope.frame()
    bad = frame[~np.isfinite(frame.absmax.to_numpy(float))]
    assert bad.step.min() == 3
    assert bad.sentinel.all()
    first = bad[(bad.step == 3) & (bad.kind == "activation")]
    assert set(first.module) == {"2", "3"}  # the poisoning module and what follows it
    assert check(first.set_index("module").absmax["2"])
    clean = frame[(frame.step == 3) & frame.module.isin(["0", "1"]) & (frame.kind == "activation")]
    assert len(clean) == 2
    assert np.isfinite(clean.absmax.to_numpy(float)).all()


def test_eval_forwards_are_not_watched_by_the_sentinel():
    model = _model()
    with layerscope.watch(model, every=Schedule(every=10, sentinel=True)) as scope:
        _train(model, scope, steps=2)
        model.eval()
        with torch.no_grad():
            model(torch.randn(4, 6))
    frame = scope.frame()
    assert set(frame[frame.sentinel].phase) == {"train"}
    assert set(frame[frame.phase == "eval"].step) == set()


def test_sentinel_false_watches_nothing_between_recorded_steps():
    model = _model()
    with layerscope.watch(model, every=Schedule(every=10, sentinel=False)) as scope:
        _train(model, scope, steps=4)
    frame = scope.frame()
    assert not frame.sentinel.any()
    assert set(frame.step) == {0}


def test_sentinel_only_watches_the_captured_kinds_and_skips_without_them():
    model = _model()
    with layerscope.watch(model, every=Schedule(every=10, sentinel=True), kinds=("grad",)) as scope:
        _train(model, scope, steps=3)
    frame = scope.frame()
    assert set(frame[frame.sentinel].kind) == {"grad"}
    with layerscope.watch(
        model, every=Schedule(every=10, sentinel=True), kinds=("weight",)
    ) as scope:
        _train(model, scope, steps=3)
    assert not scope.frame().sentinel.any()


def test_the_store_keeps_sentinel_rows_with_missing_statistics(tmp_path):
    model = _model()
    with layerscope.watch(
        model, every=Schedule(every=3, sentinel=True), run=tmp_path / "run"
    ) as scope:
        _train(model, scope, steps=4)
    memory = scope.frame()
    run = layerscope.load(tmp_path / "run")
    stored = run.stats.sort_values(["step", "module", "kind"]).reset_index(drop=True)
    memory = memory.sort_values(["step", "module", "kind"]).reset_index(drop=True)
    assert stored.sentinel.tolist() == memory.sentinel.tolist()
    np.testing.assert_array_equal(stored.absmax.to_numpy(float), memory.absmax.to_numpy(float))
    counts = run.sql(
        "select sentinel, count(*) rows, count(mean) means, count(absmax) absmaxes, "
        "count(hist) hists from stats group by 1 order by 1"
    )
    full, sentinel = counts.iloc[0], counts.iloc[1]
    assert full.rows == full.means == full.absmaxes == full.hists
    assert sentinel.rows == sentinel.absmaxes > 0
    assert sentinel.means == sentinel.hists == 0  # missing, not NaN: SQL aggregates skip them
    steps = run.sql("select distinct step from stats where kind = 'grad' order by 1").step
    assert steps.tolist() == [0, 1, 2, 3]


def test_a_run_of_sentinel_rows_only_makes_a_frame():
    model = _model()
    with layerscope.watch(model, every=Schedule(every=10, start=5, sentinel=True)) as scope:
        _train(model, scope, steps=2)
    frame = scope.frame()
    assert len(frame) > 0
    assert frame.sentinel.all()
    assert frame["mean"].isna().all()


def test_scope_flush_writes_the_sentinel_rows_of_finished_steps(tmp_path):
    model = _model()
    scope = layerscope.watch(model, every=Schedule(every=100, sentinel=True), run=tmp_path / "r")
    _train(model, scope, steps=3)
    scope.flush()
    stored = layerscope.load(tmp_path / "r").stats
    assert sorted(set(stored[stored.sentinel].step)) == [1, 2]
    scope.close()


@pytest.mark.parametrize("with_optimizer", [True, False], ids=["optimizer", "backward-end"])
def test_the_gradients_sentinel_reads_every_parameter_gradient_between_recorded_steps(
    with_optimizer,
):
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    grads: dict[tuple[int, str], np.ndarray] = {}
    steps = [0]

    def keep(*_):
        for name, param in model.named_parameters():
            grads[(steps[-1], name)] = param.grad.detach().double().numpy().ravel()

    optimizer.register_step_pre_hook(keep)
    schedule = Schedule(every=4, sentinel="gradients")
    options = {"optimizer": optimizer} if with_optimizer else {}
    with layerscope.watch(model, every=schedule, **options) as scope:
        for step in range(7):
            steps.append(step)
            model(torch.randn(5, 6)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            if not with_optimizer:
                scope.step()
    frame = scope.frame()
    sentinel = frame[frame.sentinel]
    assert set(sentinel.kind) == {"weight_grad"}  # no module hook fed it
    assert sorted(set(sentinel.step)) == [1, 2, 3, 5, 6]
    assert len(sentinel) == 5 * 4  # two Linear layers' weight and bias, each step
    for row in sentinel.itertuples():
        values = grads[(row.step, f"{row.module}.{row.tensor}")]
        assert (row.min, row.max, row.numel) == (values.min(), values.max(), values.size)
        assert row.absmax == np.abs(values).max()


def test_the_gradients_sentinel_finds_the_step_of_a_nan_and_says_what_it_cannot_see():
    poison = Poisoned(math.nan, at=5)
    model = _model(poison)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with layerscope.watch(
        model, optimizer=optimizer, every=Schedule(every=4, sentinel="gradients")
    ) as scope:
        for step in range(7):
            poison.step = step
            model(torch.randn(5, 6)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    alerts = scope.frame("alerts").query("rule == 'nonfinite'")
    assert alerts.step.tolist() == [5]
    message = alerts.message.iloc[0]
    assert "at step 5" in message
    assert "does not see" in message
    assert "Schedule(sentinel=True)" in message


@pytest.mark.parametrize("on_accelerator", [True, False])
def test_the_default_watches_the_gradients_on_an_accelerator_only(on_accelerator):
    from layerscope.hooks._steps import StepClock

    clock = StepClock(Schedule(every=5), True, lambda: on_accelerator, has_gradient_sentinel=True)
    clock.end_step()  # step 1: not recorded
    assert clock.watching_gradients == on_accelerator
    assert not clock.watching  # the per-layer sentinel only where asked for: sentinel=True
    clock.end_step(), clock.end_step(), clock.end_step()  # step 4; step 5 records
    clock.end_step()
    assert clock.step_records
    assert not clock.watching_gradients


def test_a_schedule_names_the_sentinels_it_takes():
    with pytest.raises(TypeError, match="'gradients', True or False, got 'layers'"):
        Schedule(sentinel="layers")
