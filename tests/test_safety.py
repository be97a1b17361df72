"""What watching must never do: change training, sync with the host, leak, or raise."""

import copy
import gc
import os
import subprocess
import sys
import textwrap
import warnings
import weakref

import numpy as np
import pytest
import torch
from torch import nn

import layerscope
from layerscope import LayerscopeWarning

ALL_KINDS = ("activation", "input", "grad", "weight", "weight_grad", "update", "buffer")


def _net():
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(inplace=True),
        nn.Dropout(0.2),
        nn.Flatten(),
        nn.Linear(4 * 8 * 8, 10),
    )


def _train(model, optimizer, steps, scope=None, seed=1):
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # dropout draws from the global generator
    for _ in range(steps):
        x = torch.randn(16, 1, 8, 8, generator=generator)
        y = torch.randint(0, 10, (16,), generator=generator)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if scope is not None:
            scope.step(loss=loss)


def _hook_count(model, optimizer=None):
    count = 0
    for module in model.modules():
        count += len(module._forward_hooks) + len(module._forward_pre_hooks)
        count += len(module._backward_hooks) + len(module._backward_pre_hooks)
        for param in module.parameters(recurse=False):
            count += len(getattr(param, "_post_accumulate_grad_hooks", None) or {})
            count += len(param._backward_hooks or {})
    if optimizer is not None:
        count += len(optimizer._optimizer_step_pre_hooks)
        count += len(optimizer._optimizer_step_post_hooks)
    return count


@pytest.mark.parametrize(
    "every", [1, layerscope.Schedule(every=3, sentinel=True)], ids=["every", "sentinel"]
)
@pytest.mark.parametrize("with_optimizer", [True, False])
def test_training_is_bit_identical_with_and_without_watch(with_optimizer, every):
    reference = _net()
    watched = copy.deepcopy(reference)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=1e-2)
    opt = torch.optim.Adam(watched.parameters(), lr=1e-2)
    _train(reference, ref_opt, steps=5)

    kinds = ALL_KINDS if with_optimizer else tuple(k for k in ALL_KINDS if k != "update")
    scope = layerscope.watch(
        watched, optimizer=opt if with_optimizer else None, every=every, kinds=kinds
    )
    with scope:
        _train(watched, opt, steps=5, scope=None if with_optimizer else scope)

    assert len(scope.frame()) > 0
    assert scope.failures == 0
    for (name, a), (_, b) in zip(
        reference.state_dict().items(), watched.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


def test_no_hook_is_left_after_close_or_with_or_error():
    model = _net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = _hook_count(model, optimizer)

    scope = layerscope.watch(model, optimizer=optimizer, every=1, kinds=ALL_KINDS)
    assert _hook_count(model, optimizer) > before
    _train(model, optimizer, steps=2)
    scope.close()
    assert _hook_count(model, optimizer) == before

    with layerscope.watch(model, every=1, kinds=ALL_KINDS[:5]):
        _train(model, optimizer, steps=1)
    assert _hook_count(model, optimizer) == before

    with pytest.raises(KeyError), layerscope.watch(model, every=1):
        raise KeyError("user error inside the with")
    assert _hook_count(model, optimizer) == before


def test_no_hook_is_left_on_parameters_for_weight_grads():
    model = nn.Linear(3, 3)
    with layerscope.watch(model, kinds=("weight_grad",), every=1) as scope:
        # The weight's gradient is read, and it tells that a backward pass ran (the probe).
        assert len(model.weight._post_accumulate_grad_hooks) == 2
        assert len(model.bias._post_accumulate_grad_hooks) == 1
        model(torch.randn(2, 3)).sum().backward()
        scope.step()
    assert not model.weight._post_accumulate_grad_hooks
    assert not model.bias._post_accumulate_grad_hooks


def _live_tensors():
    gc.collect()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # isinstance on deprecated lazy objects warns
        return sum(1 for obj in gc.get_objects() if isinstance(obj, torch.Tensor))


def test_memory_and_live_tensors_flat_over_100_attach_detach_cycles():
    model = _net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 1, 8, 8)

    def cycle():
        with layerscope.watch(model, optimizer=optimizer, every=1, kinds=ALL_KINDS) as scope:
            model(x).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        return scope

    for _ in range(5):  # warm caches (allocator, dispatcher) before counting
        cycle()
    baseline = _live_tensors()
    scopes = weakref.WeakSet()
    for _ in range(100):  # one tensor kept a cycle would show as 100 more
        scopes.add(cycle())
    gc.collect()
    assert _live_tensors() <= baseline
    assert len(scopes) == 0, "a closed scope is kept alive by something"


def test_nothing_holds_an_activation_alive():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    seen = []
    model[0].register_forward_hook(lambda m, a, out: seen.append(weakref.ref(out)))
    with layerscope.watch(model, every=1, kinds=ALL_KINDS[:5]) as scope:
        out = model(torch.randn(4, 8))
        out.sum().backward()
        del out
        gc.collect()
        assert seen[0]() is None, "the scope keeps a forward output alive"
        scope.step()
        assert len(scope.frame()) > 0


@pytest.mark.parametrize(
    "every", [1, layerscope.Schedule(every=2, sentinel=True)], ids=["every", "sentinel"]
)
def test_hot_path_never_reads_back_to_host(monkeypatch, every):
    model = _net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    custom = {"rms": lambda t: t.float().pow(2).mean().sqrt()}
    scope = layerscope.watch(
        model,
        optimizer=optimizer,
        every=every,
        kinds=ALL_KINDS,
        stats=[*layerscope.stats.BUILTIN_STATS, custom],
    )
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))

    def forbidden(*args, **kwargs):
        raise AssertionError("host sync in the hot path")

    with scope:
        for _ in range(4):
            with monkeypatch.context() as patched:
                for name in ("item", "tolist", "__bool__"):
                    patched.setattr(torch.Tensor, name, forbidden)
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    assert scope.failures == 0
    frame = scope.frame()
    assert set(frame.kind) == set(ALL_KINDS)
    assert frame.rms.notna().any()
    assert frame.sentinel.any() == (every != 1)


def test_a_monitoring_failure_warns_once_counts_and_training_goes_on(monkeypatch):
    from layerscope.recording import _recorder

    def broken(*args, **kwargs):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(_recorder, "write_partials", broken)
    model = _net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reference = copy.deepcopy(model)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with layerscope.watch(model, every=1, kinds=ALL_KINDS[:5]) as scope:
            _train(model, optimizer, steps=3, scope=scope)
    _train(reference, ref_opt, steps=3)
    ours = [w for w in caught if issubclass(w.category, LayerscopeWarning)]
    assert len(ours) == 1
    assert "kernel exploded" in str(ours[0].message)
    assert scope.failures > 3
    for a, b in zip(reference.parameters(), model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_failing_custom_stat_is_skipped_and_the_rest_recorded():
    def bad(tensor):
        raise ValueError("nope")

    model = nn.Linear(4, 4)
    scope = layerscope.watch(model, every=1, stats={"bad": bad})

    def one_step():
        model(torch.randn(2, 4)).sum().backward()
        scope.step()

    with pytest.warns(LayerscopeWarning, match="custom statistic 'bad'"):
        one_step()
    scope.close()
    frame = scope.frame()
    assert frame["bad"].isna().all()
    assert frame["mean"].notna().all()


def test_a_failing_flush_drops_that_step_with_a_warning_and_training_goes_on(monkeypatch):
    from layerscope.recording._buffer import DeviceRows

    take = DeviceRows.take
    calls = []

    def fails_once(self):
        calls.append(1)
        # Each step takes its rows once, with its loss, given after its optimizer step: the
        # second take is step 1's.
        if len(calls) == 2:
            raise RuntimeError("pinned memory ran out")
        return take(self)

    monkeypatch.setattr(DeviceRows, "take", fails_once)
    model = _net()
    reference = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    warned = pytest.warns(LayerscopeWarning, match="flushing a step failed.*pinned memory")
    with warned, layerscope.watch(model, optimizer=optimizer, every=1) as scope:
        _train(model, optimizer, steps=3, scope=scope)
    _train(reference, ref_opt, steps=3)
    assert sorted(set(scope.frame().step)) == [0, 2]
    assert scope.failures == 1
    for a, b in zip(reference.parameters(), model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_module_returning_its_parameter_leaves_no_hook_on_it():
    class Table(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Parameter(torch.randn(4, 8))

        def forward(self, x):
            return self.table  # a leaf: a hook on it would stay for good, one per call

    model = nn.Sequential(Table(), nn.Linear(8, 2))
    scope = layerscope.watch(model, every=1)
    for _ in range(3):
        model(None).sum().backward()
        scope.step()
    scope.close()
    frame = scope.frame()
    assert not model[0].table._backward_hooks
    collected = weakref.ref(scope)
    del scope
    gc.collect()
    assert collected() is None
    table = frame[frame.module == "0"]
    # read once a step, where it accumulates; no output gradient of its own
    assert table[table.kind == "weight_grad"].numel.tolist() == [32, 32, 32]
    assert set(table.kind) == {"activation", "weight", "weight_grad"}


class _ShapeOnly(nn.Module):
    """Returns a tensor on the meta device: a shape, no values."""

    def forward(self, x):
        return torch.empty_like(x, device="meta")


class _WithMetaOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.shape, self.net = _ShapeOnly(), nn.Sequential(nn.Linear(4, 4), nn.ReLU())

    def forward(self, x):
        self.shape(x)
        return self.net(x)


def _train_two_steps(model, every):
    with layerscope.watch(model, every=every) as scope:
        for step in range(2):
            model(torch.randn(2, 4)).sum().backward()
            scope.step(loss=float(step))
    return scope


@pytest.mark.parametrize("every", [1, layerscope.Schedule(every=2, sentinel=True)],
                         ids=["recorded", "sentinel"])  # fmt: skip
def test_a_meta_tensor_is_skipped_with_a_warning_and_the_others_recorded(every):
    with pytest.warns(LayerscopeWarning, match="'out' of 'shape'.*meta device"):
        scope = _train_two_steps(_WithMetaOutput(), every)
    frame = scope.frame()
    assert set(frame.module) == {"net.0", "net.1"}
    assert sorted(set(frame.step)) == [0, 1]  # step 1: recorded, or the sentinel's rows
    assert scope.frame("scalars").step.tolist() == [0, 1]
    assert scope.failures == 2  # the meta tensor, once a step


def test_a_numpy_scalar_is_a_scalar():
    model = nn.Linear(2, 1)
    with layerscope.watch(model, every=1) as scope:
        model(torch.ones(1, 2)).sum().backward()
        scope.step(loss=np.float32(0.5), lr=np.int64(3))
    assert scope.frame("scalars").value.tolist() == [0.5, 3.0]


def test_a_sparse_gradient_is_skipped_with_a_warning_and_the_others_recorded():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 4, sparse=True), nn.Linear(4, 2))
    reference = copy.deepcopy(model)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference)]
    tokens = torch.tensor([[1, 2, 3], [3, 4, 9]])
    scope = layerscope.watch(model, optimizer=optimizers[0], every=1, kinds=("weight_grad",))

    def train():
        for _ in range(2):
            for m, optimizer in zip((model, reference), optimizers, strict=True):
                m(tokens).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
            scope.step()

    with pytest.warns(LayerscopeWarning, match="weight_grad 'weight' of '0'.*sparse"):
        train()
    scope.close()
    frame = scope.frame()
    assert set(zip(frame.module, frame.tensor, strict=True)) == {("1", "weight"), ("1", "bias")}
    assert sorted(set(frame.step)) == [0, 1]
    assert scope.failures == 2
    for a, b in zip(reference.parameters(), model.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("every", [1, layerscope.Schedule(every=2)], ids=["every", "sentinel"])
def test_cuda_hot_path_has_no_sync(every):
    model = _net().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 1, 8, 8, device="cuda"), torch.randint(0, 10, (8,), device="cuda")
    with layerscope.watch(model, optimizer=optimizer, every=every, kinds=ALL_KINDS) as scope:
        for _ in range(4):
            torch.cuda.set_sync_debug_mode("error")
            try:
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
            finally:
                torch.cuda.set_sync_debug_mode("default")
            optimizer.step()
            optimizer.zero_grad()
            scope.step(loss=loss)
    assert scope.failures == 0
    frame = scope.frame()
    assert len(frame.query("kind == 'grad'")) > 0
    assert frame.sentinel.any() == (every != 1)


@pytest.mark.cuda
@pytest.mark.parametrize("every", [1, layerscope.Schedule(every=2)], ids=["every", "sentinel"])
def test_cuda_token_ids_and_the_optimizer_step_have_no_sync(every):
    """Integer inputs (token ids), parameters in groups, updates: no sync, the Triton kernels."""
    from layerscope.stats._partials import kernel_name

    model = nn.Sequential(nn.Embedding(50, 16), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    model = model.cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    ids = torch.randint(0, 50, (8, 6), device="cuda")
    with layerscope.watch(model, optimizer=optimizer, every=every, kinds=ALL_KINDS) as scope:
        for _ in range(4):
            torch.cuda.set_sync_debug_mode("error")
            try:
                loss = model(ids).pow(2).mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            finally:
                torch.cuda.set_sync_debug_mode("default")
    assert scope.failures == 0
    assert kernel_name("cuda") == "triton"
    frame = scope.frame()
    assert "int64" in set(frame.query("kind == 'input'").dtype)
    assert len(frame.query("kind == 'update'")) > 0


def test_the_writer_runs_torch_on_one_thread_and_leaves_training_threads_alone():
    """A second OpenMP team on the same cores slows training by up to 2x: the writer has none."""
    import threading

    class ThreadProbe:
        def __init__(self):
            self.counts = []

        def start(self, info):
            pass

        def write(self, records):
            self.counts.append(torch.get_num_threads())

        def flush(self):
            pass

        def close(self, summary):
            pass

    before = torch.get_num_threads()
    probe = ThreadProbe()
    model = nn.Linear(4, 4)
    with layerscope.watch(model, every=1, sinks=[probe]) as scope:
        model(torch.randn(2, 4)).sum().backward()
        scope.step()
        assert torch.get_num_threads() == before
        later = []
        thread = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
        thread.start()
        thread.join()
        assert later == [before]
    assert probe.counts
    assert set(probe.counts) == {1}


def test_a_deep_copy_of_a_watched_model_is_not_recorded_as_the_model():
    import copy

    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    with layerscope.watch(model, every=1, kinds=("activation", "grad")) as scope:
        ema = copy.deepcopy(model)  # an EMA copy: deepcopy keeps the hooks
        ema(torch.randn(5, 3)).sum().backward()
        model(torch.randn(2, 3)).sum().backward()
        scope.step()
    frame = scope.frame()
    assert set(frame.numel[frame.module == "0"]) == {2 * 4}  # the model's batch of 2 only
    assert scope.failures == 0


@pytest.fixture
def nothing_compiled():
    """This process as if nothing had been compiled in it (other tests compile models)."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    if dynamo is None:
        yield
        return
    saved = dict(dynamo.counters["stats"])
    dynamo.counters["stats"].clear()
    yield
    dynamo.counters["stats"].update(saved)


@pytest.mark.usefixtures("nothing_compiled")
def test_watched_modules_carry_hooks_only_on_steps_that_record():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 8), nn.ReLU()))
    deep = model[2][0]
    hooked = []
    with layerscope.watch(model, every=3, kinds=("activation", "grad")) as scope:
        for _ in range(7):
            model(torch.randn(2, 4)).sum().backward()
            hooked.append(len(deep._forward_hooks))
            scope.step()
        model.eval()
        with torch.no_grad():  # right after step 6, recorded: its evaluation is recorded
            model(torch.randn(3, 4))
    # An unrecorded step leaves the modules without hooks: torch's fast path, no cost.
    assert hooked == [1, 0, 0, 1, 0, 0, 1]
    assert not deep._forward_hooks
    frame = scope.frame()
    assert sorted(set(frame.step)) == [0, 3, 6]
    assert frame.query("phase == 'eval'").step.unique().tolist() == [6]
    assert set(frame.query("module == '2.0'").kind) == {"activation", "grad"}


@pytest.mark.slow
def test_the_torch_statistics_kernel_compiling_does_not_keep_idle_hooks_on():
    # Where the C kernel is missing (and on accelerators) the statistics are a torch.compile'd
    # kernel; its graphs are layerscope's own, not a compiled model's, so hooks still come off.
    script = textwrap.dedent(
        """
        import torch, layerscope
        from torch import nn
        from torch._dynamo.utils import counters
        from layerscope.stats import _partials
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        hooked = []
        with layerscope.watch(model, every=2, kinds=("activation",)) as scope:
            for _ in range(4):
                model(torch.randn(2, 4)).sum()
                hooked.append(len(model[0]._forward_hooks))
                scope.step()
        assert _partials.kernel_name("cpu") == "compiled", _partials.kernel_name("cpu")
        assert counters["stats"]["unique_graphs"] > 0
        print(hooked)
        """
    )
    env = {**os.environ, "LAYERSCOPE_NATIVE": "0", "LAYERSCOPE_COMPILE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[1,", "0,", "1,", "0]"]
