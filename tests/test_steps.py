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
        model, optimizer=optimizer, every=1, kinds=("weight", "weight_grad", "update")
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
    with layerscope.watch(model, every=1, kinds=("weight_grad",)) as scope:
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
        model, optimizer=optimizer, every=1, kinds=("weight_grad", "activation")
    ) as scope:
        optimizer.step(closure)
    frame = scope.frame()
    _assert_row(frame, "", "weight_grad", "weight", _stats64(last["grad"]))
    assert frame.query("kind == 'activation'").numel.item() >= 16


def test_micro_batches_merge_into_their_step():
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh())
    outputs = []
    model[1].register_forward_hook(lambda m, a, out: outputs.append(out.detach().clone()))
    with layerscope.watch(model, every=1, kinds=("activation",)) as scope:
        for batch in (3, 5):
            model(torch.randn(batch, 4)).sum().backward()
        scope.step()
    expected = _stats64(torch.cat(outputs))
    _assert_row(scope.frame(), "1", "activation", "out", {**expected, "numel": 48})


def test_eval_forwards_are_recorded_as_eval_without_advancing_the_step():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    with layerscope.watch(model, every=1, kinds=("activation",)) as scope:
        model(torch.randn(2, 4)).sum().backward()
        scope.step()
        model.eval()
        with torch.no_grad():  # right after step 0 ended: an evaluation of step 0
            for _ in range(3):
                model(torch.randn(5, 4))
        model.train()
        with torch.no_grad():  # training mode, but no gradients: still evaluation
            model(torch.randn(1, 4))
        assert scope.current_step == 1
        model(torch.randn(2, 4)).sum().backward()
        with torch.no_grad():  # in the middle of step 1: an evaluation of step 1
            model(torch.randn(3, 4))
        scope.step()
    frame = scope.frame()
    phases = frame.groupby(["step", "phase"]).numel.sum().to_dict()
    assert phases == {(0, "train"): 16, (0, "eval"): 128, (1, "eval"): 24, (1, "train"): 16}
    assert set(frame.query("phase == 'eval'").kind) == {"activation"}
    assert set(frame.call) == {0}  # every pass merged into one row per module


def test_a_module_called_twice_keeps_a_call_index_per_call():
    shared = nn.Linear(3, 3)
    model = nn.ModuleDict({"shared": shared})
    model.forward = lambda x: shared(torch.relu(shared(x)))
    seen = []
    shared.register_forward_hook(lambda m, a, out: seen.append(out.detach().clone()))
    with layerscope.watch(model, every=1, kinds=("activation", "grad")) as scope:
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
    with layerscope.watch(model, every=1, kinds=("input", "activation")) as scope:
        x = torch.tensor([[-1.0, 2.0, -3.0]])
        model[0].weight.data = torch.eye(3)
        model[0].bias.data.zero_()
        model(x)
        scope.step()
    frame = scope.frame()
    assert frame.query("module == '1' and kind == 'input'")["min"].item() == -3.0
    assert frame.query("module == '1' and kind == 'activation'")["min"].item() == 0.0
    # Named as ReLU.forward(self, input) names it.
    assert frame.query("module == '1' and kind == 'input'").tensor.item() == "in.input"


def test_buffers_are_recorded_after_the_step():
    model = nn.BatchNorm1d(3)
    with layerscope.watch(model, every=1, kinds=("buffer",)) as scope:
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
    from layerscope.writer import _pipeline

    monkeypatch.setattr(_pipeline, "WAITING_BATCHES", waiting_batches)
    stats = {"rms": lambda t: t.pow(2).mean().sqrt()} if with_custom else None

    def run(rows_per_flush):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        scope = layerscope.watch(
            model, every=1, stats=stats, kinds=("activation", "grad", "weight")
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
    from layerscope.writer import _pipeline

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
    from layerscope.recording import _recorder

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
    with layerscope.watch(model, optimizer=optimizer, every=1, kinds=("weight_grad",)) as scope:
        scaler.scale(model(x).pow(2).mean()).backward()
        scaler.step(optimizer)
        scaler.update()
    twin(x).pow(2).mean().backward()  # the same gradient, never scaled
    _assert_row(scope.frame(), "", "weight_grad", "weight", _stats64(twin.weight.grad))


def test_layerscope_measures_its_own_cost_on_the_training_thread(monkeypatch, tmp_path):
    import time

    from layerscope.recording import _recorder

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


def _amp_loop(scope, model, optimizer, scaler, iterations, *, scope_step, scale=100.0):
    for _ in range(iterations):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(torch.randn(4, 8) * scale).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        if scope_step:
            scope.step(loss=loss)


@pytest.mark.parametrize("scope_step", [True, False])
def test_an_iteration_whose_step_grad_scaler_skipped_is_a_step_of_its_own(scope_step):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    # 2**20 overflows fp16 gradients: GradScaler skips and halves the scale, until it fits.
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**20, growth_interval=1000)
    skipped = []
    with layerscope.watch(model, optimizer=optimizer, every=1) as scope:
        for _ in range(6):
            before = scaler.get_scale()
            _amp_loop(scope, model, optimizer, scaler, 1, scope_step=scope_step, scale=1.0)
            skipped.append(scaler.get_scale() < before)
        scope.close()
    assert skipped[0]  # some steps skipped, then it trained
    assert not all(skipped)
    frame = scope.frame()
    # The last iteration ends at its optimizer step, or (if skipped, without scope.step())
    # stays the step in progress at close.
    steps = sorted(set(frame.step))
    assert steps == list(range(6))
    activations = frame.query("kind == 'activation' and module == '0'")
    assert activations.numel.tolist() == [4 * 16] * 6  # one iteration each, not 6x in step 0
    scalars = scope.frame("scalars")
    marked = scalars.query("name == 'skipped'").step.tolist()
    expected = [step for step, was in enumerate(skipped) if was]
    if not scope_step and skipped[-1]:
        expected = expected[:-1]  # nothing tells that the last one was skipped
    assert marked == expected
    if scope_step:
        assert scalars.query("name == 'loss'").step.tolist() == list(range(6))
    # A skipped step's gradients are recorded under it, scaled, with their Inf and NaN.
    grads = frame.query("kind == 'weight_grad'")
    nonfinite = (grads.nan_count + grads.inf_count).groupby(grads.step).sum()
    assert (nonfinite > 0).tolist() == skipped


def test_training_under_grad_scaler_is_bit_identical_watched():
    def train(watched):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**20)
        scope = layerscope.watch(model, optimizer=optimizer, every=1) if watched else None
        _amp_loop(scope, model, optimizer, scaler, 5, scope_step=watched)
        if scope is not None:
            scope.close()
        return [p.detach().clone() for p in model.parameters()], scaler.get_scale()

    (plain, plain_scale), (watched, watched_scale) = train(False), train(True)
    assert plain_scale == watched_scale
    assert all(torch.equal(a, b) for a, b in zip(plain, watched, strict=True))


def test_an_evaluation_right_after_a_recorded_step_belongs_to_it():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with layerscope.watch(model, optimizer=optimizer, every=5, kinds=("activation",)) as scope:
        for step in range(11):
            model(torch.randn(2, 4)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step(loss=float(step))
            if step % 5 == 0:  # the natural cadence: evaluate after the step just taken
                model.eval()
                with torch.no_grad():
                    for _ in range(2):
                        model(torch.randn(3, 4))
                model.train()
                # Visible as soon as it ran, with the scalar just passed.
                frame = scope.frame()
                evaluated = frame.query(f"phase == 'eval' and step == {step}")
                assert set(evaluated.module) == {"0", "1", "2"}
                assert evaluated.query("module == '0'").numel.item() == 2 * 3 * 8
                assert scope.frame("scalars").step.max() == step
    frame = scope.frame()
    assert sorted(set(frame.query("phase == 'eval'").step)) == [0, 5, 10]
    assert sorted(set(frame.query("phase == 'train'").step)) == [0, 5, 10]
    # One row per step, module and phase: the evaluation's batches merged, nothing twice.
    assert not frame.duplicated(["step", "phase", "module", "call"]).any()


def test_an_evaluation_before_a_recorded_step_is_recorded_under_the_step_it_follows():
    # A trainer evaluating every 5 of its steps does it after its step 5, 10: steps 4, 9 here.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with layerscope.watch(model, optimizer=optimizer, every=5, kinds=("activation",)) as scope:
        for step in range(12):
            model(torch.randn(2, 4)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            if step in (2, 4, 9):  # step 3 is not recorded: the evaluation after 2 is not
                model.eval()
                with torch.no_grad():
                    model(torch.randn(3, 4))
                model.train()
    frame = scope.frame()
    evaluated = frame.query("phase == 'eval'")
    assert sorted(set(evaluated.step)) == [4, 9]
    assert set(evaluated.query("module == '0'").numel) == {3 * 8}
    assert sorted(set(frame.query("phase == 'train'").step)) == [0, 5, 10]


def test_forward_passes_through_a_child_merge_like_passes_through_the_root():
    class Wrapper(nn.Module):  # like a LightningModule: training_step calls self.net
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
            self.head = nn.Linear(1, 1)

        def forward(self, x):
            raise AssertionError("never called")

    torch.manual_seed(0)
    model = Wrapper()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with layerscope.watch(model, optimizer=optimizer, every=1, kinds=("activation",)) as scope:
        for _ in range(2):
            for _ in range(3):  # micro-batches: net, then head, then backward
                model.head(model.net(torch.randn(2, 4))).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            model.eval()
            with torch.no_grad():
                for _ in range(4):  # validation batches, no backward between them
                    model.net(torch.randn(5, 4))
            model.train()
    frame = scope.frame()
    assert set(frame.call) == {0}
    train = frame.query("phase == 'train' and module == 'net.0'")
    assert train.numel.tolist() == [3 * 2 * 8] * 2
    evaluation = frame.query("phase == 'eval' and module == 'net.0'")
    assert evaluation.step.tolist() == [0, 1]
    assert evaluation.numel.tolist() == [4 * 5 * 8] * 2
    calls = scope.frame("calls")
    entered = calls.query("event == 'enter'").groupby("step").module.apply(list).to_dict()
    one_pass = ["net.0", "net.1", "net.2", "head"]  # each step: one forward pass, once each
    assert entered == {0: one_pass, 1: one_pass}


def test_several_optimizers_are_read_around_their_own_steps():
    torch.manual_seed(0)
    generator, critic = nn.Linear(3, 3), nn.Linear(3, 1)
    model = nn.ModuleDict({"generator": generator, "critic": critic})
    gen_opt = torch.optim.SGD(generator.parameters(), lr=0.1)
    critic_opt = torch.optim.SGD(critic.parameters(), lr=0.1)
    seen = {}
    critic_opt.register_step_pre_hook(
        lambda *a: seen.update(critic_grad=critic.weight.grad.clone())
    )
    gen_opt.register_step_pre_hook(lambda *a: seen.update(gen_grad=generator.weight.grad.clone()))
    with layerscope.watch(
        model,
        optimizer=[gen_opt, critic_opt],  # the generator steps last: its step ends the step
        every=1,
        kinds=("weight_grad", "update"),
    ) as scope:
        for _ in range(3):
            for _ in range(2):  # the critic steps twice per iteration
                critic(generator(torch.randn(4, 3)).detach()).mean().backward()
                critic_opt.step()
                critic_opt.zero_grad()
            critic(generator(torch.randn(4, 3))).mean().neg().backward()
            gen_opt.step()
            gen_opt.zero_grad()
            critic_opt.zero_grad()
            frame = scope.frame()
            step = scope.current_step - 1
            _assert_row(
                frame, "critic", "weight_grad", "weight", _stats64(seen["critic_grad"]), step
            )
            _assert_row(
                frame, "generator", "weight_grad", "weight", _stats64(seen["gen_grad"]), step
            )
    assert scope.current_step == 3
    assert set(scope.frame().query("kind == 'update'").module) == {"critic", "generator"}


def test_a_resumed_training_numbers_its_steps_from_start_step():
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with layerscope.watch(model, optimizer=optimizer, every=5, start_step=1003) as scope:
        for step in range(8):
            model(torch.randn(2, 3)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step(loss=float(step))
    # every=5 is of the step numbers: 1005 and 1010 record, whatever step the training began at.
    assert sorted(set(scope.frame().step)) == [1005, 1010]
    assert scope.frame("scalars").step.tolist() == list(range(1003, 1011))


@pytest.mark.parametrize(
    ("value", "error"), [(-1, ValueError), (2.0, TypeError), (True, TypeError)]
)
def test_start_step_must_be_a_count(value, error):
    with pytest.raises(error, match="start_step: expected an int >= 0"):
        layerscope.watch(nn.Linear(2, 2), start_step=value)
