"""Steps and phases: optimizer-driven steps, eval passes, micro-batches, scalars."""

import numpy as np
import pytest
import torch
from torch import nn

import layerscope


def _stats64(tensor):
    values = tensor.detach().double().reshape(-1).numpy()
    return {
        "mean": values.mean(),
        "std": values.std(ddof=1),
        "min": values.min(),
        "max": values.max(),
        "l2": np.linalg.norm(values),
    }


def _assert_row(frame, module, kind, tensor, expected, step=None):
    query = f"module == '{module}' and kind == '{kind}' and tensor == '{tensor}'"
    if step is not None:
        query += f" and step == {step}"
    rows = frame.query(query)
    assert len(rows) == 1, (module, kind, tensor, step)
    row = rows.iloc[0]
    for name, value in expected.items():
        assert row[name] == pytest.approx(value, rel=1e-5, abs=1e-7), (kind, tensor, name)


def test_optimizer_ends_steps_and_reads_grads_before_and_weights_after():
    model = nn.Linear(5, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    seen = {}

    def before(opt, args, kwargs):
        seen["grad"] = model.weight.grad.clone()
        seen["before"] = model.weight.detach().clone()

    optimizer.register_step_pre_hook(before)
    scope = layerscope.watch(
        model, optimizer=optimizer, every=1, capture=("weight", "weight_grad", "update")
    )
    optimizer.register_step_post_hook(lambda *a: seen.update(after=model.weight.detach().clone()))
    with scope:
        for step in range(3):
            model(torch.randn(4, 5)).pow(2).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step(loss=float(step))
            frame = scope.frame()
            _assert_row(frame, "", "weight_grad", "weight", _stats64(seen["grad"]), step)
            _assert_row(frame, "", "weight", "weight", _stats64(seen["after"]), step)
            _assert_row(
                frame, "", "update", "weight", _stats64(seen["after"] - seen["before"]), step
            )
    assert scope.current_step == 3
    scalars = scope.frame("scalars")
    assert scalars.values.tolist() == [[0, "loss", 0.0], [1, "loss", 1.0], [2, "loss", 2.0]]


def test_weight_grads_without_optimizer_are_read_when_backward_ends():
    model = nn.Linear(5, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with layerscope.watch(model, every=1, capture=("weight_grad",)) as scope:
        batches = [torch.randn(4, 5) for _ in range(3)]
        for x in batches:  # three micro-batches accumulate
            model(x).sum().backward()
        accumulated = model.weight.grad.clone()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)  # gone by the time scope.step() runs
        scope.step()
    _assert_row(scope.frame(), "", "weight_grad", "weight", _stats64(accumulated))


def test_closure_optimizers_read_grads_after_the_closure():
    model = nn.Linear(3, 1)
    optimizer = torch.optim.LBFGS(model.parameters(), max_iter=2)
    x, y = torch.randn(16, 3), torch.randn(16, 1)
    last = {}

    def closure():
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        last["grad"] = model.weight.grad.clone()
        return loss

    with layerscope.watch(
        model, optimizer=optimizer, every=1, capture=("weight_grad", "activation")
    ) as scope:
        optimizer.step(closure)
    frame = scope.frame()
    _assert_row(frame, "", "weight_grad", "weight", _stats64(last["grad"]))
    assert frame.query("kind == 'activation'").numel.item() >= 16


def test_micro_batches_merge_into_their_step():
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh())
    outputs = []
    model[1].register_forward_hook(lambda m, a, out: outputs.append(out.detach().clone()))
    with layerscope.watch(model, every=1, capture=("activation",)) as scope:
        for batch in (3, 5):
            model(torch.randn(batch, 4)).sum().backward()
        scope.step()
    expected = _stats64(torch.cat(outputs))
    _assert_row(scope.frame(), "1", "activation", "out", {**expected, "numel": 48})


def test_eval_forwards_are_recorded_as_eval_without_advancing_the_step():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    with layerscope.watch(model, every=1, capture=("activation",)) as scope:
        model(torch.randn(2, 4)).sum().backward()
        scope.step()
        model.eval()
        with torch.no_grad():
            for _ in range(3):
                model(torch.randn(5, 4))
        model.train()
        with torch.no_grad():  # training mode, but no gradients: still evaluation
            model(torch.randn(1, 4))
        assert scope.current_step == 1
        model(torch.randn(2, 4)).sum().backward()
        scope.step()
    frame = scope.frame()
    phases = frame.groupby(["step", "phase"]).numel.sum().to_dict()
    assert phases == {(0, "train"): 16, (1, "eval"): 128, (1, "train"): 16}  # 2 modules
    assert set(frame.query("phase == 'eval'").kind) == {"activation"}


def test_a_module_called_twice_keeps_a_call_index_per_call():
    shared = nn.Linear(3, 3)
    model = nn.ModuleDict({"shared": shared})
    model.forward = lambda x: shared(torch.relu(shared(x)))
    seen = []
    shared.register_forward_hook(lambda m, a, out: seen.append(out.detach().clone()))
    with layerscope.watch(model, every=1, capture=("activation", "grad")) as scope:
        model(torch.randn(2, 3)).sum().backward()
        scope.step()
    frame = scope.frame().query("module == 'shared' and kind == 'activation'")
    assert frame.call.tolist() == [0, 1]
    assert frame["mean"].tolist() == pytest.approx([float(s.double().mean()) for s in seen])
    grads = scope.frame().query("kind == 'grad'")
    assert sorted(grads.call) == [0, 1]
    # The second call's output is the loss input: its gradient is all ones.
    assert grads.query("call == 1")["mean"].item() == pytest.approx(1.0)


def test_scalars_accept_numbers_and_tensors_and_reject_others():
    model = nn.Linear(2, 2)
    with layerscope.watch(model, every=2) as scope:
        for step in range(3):
            model(torch.ones(1, 2)).sum().backward()
            scope.step(loss=torch.tensor(step + 0.5), lr=0.1)
        with pytest.raises(ValueError, match="loss"):
            scope.step(loss=torch.ones(2))
        with pytest.raises(TypeError, match="note"):
            scope.step(note="hi")
    scalars = scope.frame("scalars")
    assert scalars.query("name == 'loss'").value.tolist() == [0.5, 1.5, 2.5]
    assert scalars.query("name == 'lr'").step.tolist() == [0, 1, 2]


def test_inputs_are_read_before_in_place_modules_change_them():
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(inplace=True))
    with layerscope.watch(model, every=1, capture=("input", "activation")) as scope:
        x = torch.tensor([[-1.0, 2.0, -3.0]])
        model[0].weight.data = torch.eye(3)
        model[0].bias.data.zero_()
        model(x)
        scope.step()
    frame = scope.frame()
    assert frame.query("module == '1' and kind == 'input'")["min"].item() == -3.0
    assert frame.query("module == '1' and kind == 'activation'")["min"].item() == 0.0
    assert frame.query("module == '1' and kind == 'input'").tensor.item() == "in.0"


def test_buffers_are_recorded_after_the_step():
    model = nn.BatchNorm1d(3)
    with layerscope.watch(model, every=1, capture=("buffer",)) as scope:
        model(torch.randn(8, 3) + 5)
        scope.step()
    frame = scope.frame()
    assert set(frame.tensor) == {"running_mean", "running_var", "num_batches_tracked"}
    _assert_row(frame, "", "buffer", "running_mean", _stats64(model.running_mean))
    assert frame.query("tensor == 'num_batches_tracked'")["mean"].isna().all()  # counts only


@pytest.mark.parametrize("with_custom", [False, True])
@pytest.mark.parametrize("waiting_batches", [1, 3, 64])
def test_many_forward_passes_in_one_step_flush_early_and_merge_the_same(
    with_custom, waiting_batches, monkeypatch
):
    # The writer merges up to waiting_batches batches at once: 1 carries every piece of a step
    # to the next, 3 ends groups in the middle of steps, 64 takes both steps in one group.
    from layerscope import _pipeline

    monkeypatch.setattr(_pipeline, "WAITING_BATCHES", waiting_batches)
    stats = {"rms": lambda t: t.pow(2).mean().sqrt()} if with_custom else None

    def run(rows_per_flush):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        scope = layerscope.watch(
            model, every=1, stats=stats, capture=("activation", "grad", "weight")
        )
        scope._recorder.rows_per_flush = rows_per_flush
        capacity = []
        for step in range(2):
            for _ in range(7):  # accumulation: 7 passes, 6 readings each
                model(torch.randn(3, 4)).sum().backward()
                buffers = scope._recorder.buffers.values()
                capacity.append(max(rows._data.shape[0] for _, rows in buffers))
            model.eval()
            with torch.no_grad():
                for _ in range(5):
                    model(torch.randn(2, 4))
            model.train()
            scope.step(loss=float(step))
        scope.close()
        return scope.frame(), scope.frame("scalars"), max(capacity)

    whole, whole_scalars, _ = run(rows_per_flush=10_000)
    pieces, piece_scalars, capacity = run(rows_per_flush=5)
    assert capacity <= 64  # the buffer never grew past its first allocation
    assert len(whole) == len(pieces) == 2 * (3 + 3 + 3 + 4)  # act, grad, eval act, weights
    columns = ["numel", "mean", "std", "min", "max", "l2", "zero_frac"]
    key = ["step", "phase", "module", "kind", "tensor", "call"]
    whole, pieces = whole.sort_values(key), pieces.sort_values(key)
    assert whole[key].values.tolist() == pieces[key].values.tolist()
    np.testing.assert_allclose(
        whole[columns].to_numpy(float), pieces[columns].to_numpy(float), rtol=1e-12
    )
    assert [h.tolist() for h in whole["hist"]] == [h.tolist() for h in pieces["hist"]]
    if with_custom:
        np.testing.assert_allclose(
            whole.rms.to_numpy(float), pieces.rms.to_numpy(float), rtol=1e-12
        )
    assert whole_scalars.values.tolist() == piece_scalars.values.tolist()


@pytest.mark.parametrize("waiting_readings", [8192, 12])
def test_the_writer_finalises_once_per_flush_not_once_per_step(
    monkeypatch, tmp_path, waiting_readings
):
    from layerscope import _pipeline

    monkeypatch.setattr(_pipeline, "WAITING_READINGS", waiting_readings)
    calls = []
    finalize_merged = _pipeline.finalize_merged
    monkeypatch.setattr(
        _pipeline,
        "finalize_merged",
        lambda merged, *args: calls.append(len(merged.keys)) or finalize_merged(merged, *args),
    )
    model = nn.Linear(3, 2)
    store = layerscope.store.ParquetStore(tmp_path / "run", flush_steps=10, flush_seconds=3600)
    with layerscope.watch(model, every=1, run=store) as scope:
        for _ in range(25):
            model(torch.randn(4, 3)).sum().backward()
            scope.step()
    # activation, grad, weight, bias and their grads: 6 rows a step
    if waiting_readings == 8192:
        assert calls == [10 * 6, 10 * 6, 5 * 6]
    else:  # two steps' readings fill the writer: it finalises them before the flush is due
        assert calls == [2 * 6] * 12 + [6]
    assert len(layerscope.load(tmp_path / "run").stats) == 25 * 6


def test_scalars_of_unrecorded_steps_do_not_pile_up():
    from layerscope import _recorder

    model = nn.Linear(2, 2)
    with layerscope.watch(model, every=layerscope.Schedule(stop=1)) as scope:
        for step in range(3 * _recorder.UNRECORDED_PER_FLUSH):
            scope.step(loss=torch.tensor(float(step)))
            assert len(scope._recorder.scalars) <= _recorder.UNRECORDED_PER_FLUSH
    losses = scope.frame("scalars")
    assert losses.value.tolist() == [float(s) for s in range(3 * _recorder.UNRECORDED_PER_FLUSH)]


def test_weight_grads_under_grad_scaler_are_unscaled():
    import copy

    model = nn.Linear(6, 3)
    twin = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    x = torch.randn(5, 6)
    with layerscope.watch(model, optimizer=optimizer, every=1, capture=("weight_grad",)) as scope:
        scaler.scale(model(x).pow(2).mean()).backward()
        scaler.step(optimizer)
        scaler.update()
    twin(x).pow(2).mean().backward()  # the same gradient, never scaled
    _assert_row(scope.frame(), "", "weight_grad", "weight", _stats64(twin.weight.grad))


def test_layerscope_measures_its_own_cost_on_the_training_thread(monkeypatch, tmp_path):
    import time

    from layerscope import _recorder

    real = _recorder.write_partials
    calls = []

    def slow(tensor, histogram, rows, index):
        calls.append(1)
        time.sleep(0.002)
        real(tensor, histogram, rows, index)

    monkeypatch.setattr(_recorder, "write_partials", slow)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    started = time.perf_counter()
    with layerscope.watch(model, optimizer=optimizer, every=2, run=tmp_path / "r") as scope:
        for _ in range(4):
            model(torch.randn(2, 4)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    elapsed = time.perf_counter() - started
    assert len(calls) == 2 * (2 + 2 + 2 + 2)  # 2 recorded steps: act, grad, weight, weight_grad
    assert 0.002 * len(calls) <= scope.cost_seconds < elapsed
    meta = layerscope.load(tmp_path / "r").meta
    assert meta["cost_seconds"] == pytest.approx(scope.cost_seconds)
    # the writer and file threads' CPU time: each at most its own lifetime within the run
    assert 0 < meta["writer_seconds"] < 2 * elapsed
