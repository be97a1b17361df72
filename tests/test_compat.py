"""Wrapped and transformed models: torch.compile, checkpointing, DDP, Hugging Face, bf16."""

import copy
import logging
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.utils.checkpoint as checkpoint
from torch import nn

import layerscope
from layerscope.stats import _torch_kernels

STAT_COLUMNS = ["numel", "mean", "std", "min", "max", "absmax", "l2", "zero_frac", "nan_count"]
KEY = ["step", "phase", "module", "kind", "tensor", "call"]


def _run(model, steps=2, kinds=("activation", "grad", "weight", "weight_grad")):
    generator = torch.Generator().manual_seed(3)
    with layerscope.watch(model, every=1, kinds=kinds) as scope:
        for _ in range(steps):
            x = torch.randn(4, 8, generator=generator, requires_grad=True)
            model(x).pow(2).mean().backward()
            scope.step()
    assert scope.failures == 0
    return scope.frame().sort_values(KEY).reset_index(drop=True)


def _assert_same_stats(a, b, rtol=1e-6):
    assert a[KEY].values.tolist() == b[KEY].values.tolist()
    np.testing.assert_allclose(
        a[STAT_COLUMNS].to_numpy(float), b[STAT_COLUMNS].to_numpy(float), rtol=rtol, atol=1e-7
    )


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.down = nn.Linear(16, 8)

    def forward(self, x):
        return x + self.down(self.act(self.up(x)))


class Stack(nn.Module):
    def __init__(self, checkpointing=None):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(3)])
        self.checkpointing = checkpointing

    def forward(self, x):
        for block in self.blocks:
            if self.checkpointing is None:
                x = block(x)
            else:
                x = checkpoint.checkpoint(block, x, use_reentrant=self.checkpointing == "reentrant")
        return x


@pytest.mark.parametrize("mode", ["reentrant", "non-reentrant"])
def test_activation_checkpointing_counts_each_call_once(mode):
    plain = Stack()
    checkpointed = copy.deepcopy(plain)
    checkpointed.checkpointing = mode
    reference, ours = _run(plain), _run(checkpointed)
    assert len(ours.query("kind == 'grad'")) == 2 * 9  # 9 watched modules, 2 steps
    _assert_same_stats(reference, ours)


@pytest.mark.slow
def test_compiled_model_gives_the_same_statistics_as_eager():
    eager = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    compiled = torch.compile(copy.deepcopy(eager))
    reference, ours = _run(eager), _run(compiled)
    assert set(ours.module) == {"0", "1", "2"}  # named as the eager model, no "_orig_mod"
    _assert_same_stats(reference, ours, rtol=1e-5)  # compiled kernels round differently


def test_ddp_wrapped_model_is_named_as_the_inner_model(tmp_path):
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        plain = Stack()
        wrapped = nn.parallel.DistributedDataParallel(copy.deepcopy(plain))
        reference, ours = _run(plain), _run(wrapped)
        assert not any(name.startswith("module") for name in ours.module)
        _assert_same_stats(reference, ours)
    finally:
        dist.destroy_process_group()


def _ddp_rank(rank: int, directory: str, with_optimizer: bool) -> None:
    import torch.distributed as dist

    store = dist.FileStore(f"{directory}/store", 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
        ddp = nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
        scope = layerscope.watch(
            ddp,
            optimizer=optimizer if with_optimizer else None,
            every=1,
            kinds=("weight_grad",),
        )
        torch.manual_seed(100 + rank)  # each rank its own data: local gradients differ
        ddp(torch.randn(8, 4)).pow(2).sum().backward()
        reduced = {name: p.grad.clone() for name, p in model.named_parameters()}
        optimizer.step()
        optimizer.zero_grad()
        scope.step()
        scope.close()
        recorded = scope.frame().set_index(["module", "tensor"])
        for name, grad in reduced.items():
            row = recorded.loc[tuple(name.split("."))]
            assert row["mean"] == pytest.approx(grad.double().mean().item(), rel=1e-12)
            assert row["max"] == grad.max().item()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("with_optimizer", [False, True])
def test_ddp_weight_grads_are_read_after_the_all_reduce(tmp_path, with_optimizer):
    # Without an optimizer the read waits for the end of backward, where DDP's own callback
    # writes the averaged gradients back; it must run after that one.
    import torch.multiprocessing as mp

    mp.spawn(_ddp_rank, args=(str(tmp_path), with_optimizer), nprocs=2)


def test_hugging_face_model_outputs_are_named_by_field():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=50, n_positions=16)
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, 50, (2, 8))
    include = [r"^transformer\.h\.0\.attn$", "^lm_head$", r"^transformer\.wte$"]
    with layerscope.watch(model, every=1, include=include) as scope:
        out = model(ids, labels=ids)
        out.loss.backward()
        scope.step(loss=out.loss)
    frame = scope.frame()
    # lm_head's weight is the token embedding's: computed once, reported under both.
    weights = frame.query("kind == 'weight'").set_index("module")
    assert weights.loc["lm_head", "mean"] == weights.loc["transformer.wte", "mean"]
    attention = frame.query("module == 'transformer.h.0.attn' and kind == 'activation'")
    assert "out.0" in set(attention.tensor)
    assert scope.failures == 0


def test_hugging_face_model_output_fields_from_the_root():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=16)
    model = transformers.GPT2LMHeadModel(config)
    with layerscope.watch(model, every=1, include="^$") as scope:
        model(torch.randint(0, 50, (2, 8)), labels=torch.randint(0, 50, (2, 8))).loss.backward()
        scope.step()
    tensors = set(scope.frame().query("kind == 'activation'").tensor)
    assert {"out.loss", "out.logits"} <= tensors


def test_bfloat16_model_is_reduced_in_float32():
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU()).to(torch.bfloat16)
    outputs = []
    model[1].register_forward_hook(lambda m, a, out: outputs.append(out.detach().clone()))
    with layerscope.watch(model, every=1) as scope:
        model(torch.randn(64, 8, dtype=torch.bfloat16)).float().sum().backward()
        scope.step()
    row = scope.frame().query("module == '1' and kind == 'activation'").iloc[0]
    assert row["dtype"] == "bfloat16"
    values = outputs[0].double().numpy()
    assert row["mean"] == pytest.approx(values.mean(), rel=1e-5)
    assert row["std"] == pytest.approx(values.std(ddof=1), rel=1e-5)
    assert row["hist"].sum() == values.size


@pytest.mark.slow
def test_a_compiled_model_keeps_one_graph_on_unrecorded_steps():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    x = torch.randn(4, 8)
    torch._dynamo.reset()
    for sentinel in (False, True):  # the sentinel stays out of compiled code
        with layerscope.watch(model, every=layerscope.Schedule(start=10**9, sentinel=sentinel)):
            idle = torch._dynamo.explain(model)(x)
        assert idle.graph_break_count == 0
        assert idle.graph_count == 1
    torch._dynamo.reset()
    with layerscope.watch(model, every=1):
        recording = torch._dynamo.explain(model)(x)
    assert recording.graph_count == 0  # a recorded step runs eagerly, compiling nothing
    torch._dynamo.reset()


@pytest.mark.slow
def test_a_compiled_model_records_its_recorded_steps_and_no_others():
    # Compiled after watch(), as a training script may: the hooks stay for good, and a
    # compiled frame's gates follow the step, not the evaluation window after a recorded one.
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    recompiled = _RecompileLog()
    torch._logging.set_logs(recompiles=True)
    logging.getLogger("torch._dynamo").addHandler(recompiled)
    try:
        with layerscope.watch(
            model, optimizer=optimizer, every=layerscope.Schedule(every=5), kinds=("activation",)
        ) as scope:
            compiled = torch.compile(model)
            for _ in range(11):
                compiled(torch.randn(4, 8)).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
    finally:
        logging.getLogger("torch._dynamo").removeHandler(recompiled)
        torch._logging.set_logs()
    frame = scope.frame()
    assert sorted(set(frame.step)) == [0, 5, 10]
    assert set(frame.numel[frame.module == "1"]) == {4 * 16}  # one pass each, none twice
    # Dynamo compiles none of layerscope's code on its own: recorded steps run the hooks
    # eagerly through one function, and no hook's frame is recompiled per module.
    ours = str(Path(layerscope.__file__).parent)
    assert [where for where in recompiled.functions if ours in where] == []
    torch._dynamo.reset()


class _RecompileLog(logging.Handler):
    """The functions of dynamo's "Recompiling function NAME in FILE:LINE" records."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.functions: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        first = record.getMessage().strip().splitlines()[0]
        if first.startswith("Recompiling function"):
            self.functions.append(first)


def _current_stance() -> str:
    return torch._dynamo.eval_frame._stance.stance


@pytest.mark.slow
def test_a_compiled_model_runs_its_recorded_steps_eagerly_and_never_breaks_its_graph():
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU())
    compiled = torch.compile(model, backend="eager")  # dynamo's graphs, no inductor: fast
    stances = []
    torch._dynamo.utils.counters.clear()
    ours_before = _torch_kernels.own_graph_count()
    with layerscope.watch(compiled, every=layerscope.Schedule(every=3)) as scope:
        for _ in range(7):
            stances.append(_current_stance())
            compiled(torch.randn(4, 8)).sum().backward()
            scope.step()
    assert stances == ["force_eager", "default", "default"] * 2 + ["force_eager"]
    assert _current_stance() == "default"  # left as found
    # A graph break in the Sequential's loop would make dynamo run it eagerly for good.
    assert dict(torch._dynamo.utils.counters["graph_break"]) == {}
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    ours = _torch_kernels.own_graph_count() - ours_before
    assert graphs - ours == 1  # the model's; any others are the statistics kernel's
    frame = scope.frame()
    assert sorted(set(frame.step)) == [0, 3, 6]
    assert set(frame.numel[(frame.module == "3") & (frame.kind == "activation")]) == {4 * 16}
    torch._dynamo.reset()


def test_a_stance_the_user_set_is_left_alone():
    model = nn.Sequential(nn.Linear(4, 4))
    torch.compiler.set_stance("eager_on_recompile")
    try:
        with layerscope.watch(model, every=1) as scope:
            model(torch.randn(2, 4)).sum().backward()
            assert _current_stance() == "eager_on_recompile"
            scope.step()
        assert _current_stance() == "eager_on_recompile"
    finally:
        torch.compiler.set_stance("default")


def test_compiled_functions_run_compiled_where_layerscope_allows_them_on_a_recorded_step():
    from layerscope.stats import _stance as stance

    add_one = torch.compile(lambda x: x + 1, backend="eager")
    x = torch.randn(3)
    add_one(x)
    counters = torch._dynamo.utils.counters
    holder = object()
    stance.follow_eager_stance(holder, True)
    try:
        assert _current_stance() == "force_eager"
        counters.clear()
        add_one(x + 0.5)  # another guard: compiling it would count a frame
        assert counters["frames"]["total"] == 0  # forced eager
        with stance.compiled_allowed():
            add_one(torch.randn(5))
        assert counters["frames"]["total"] > 0  # compiled
        assert _current_stance() == "force_eager"
    finally:
        stance.release_eager_stance(holder)
    assert _current_stance() == "default"


def test_a_scope_dropped_open_gives_the_default_stance_back():
    # A notebook that re-runs a cell drops its open scope: compiled code must not stay eager.
    import gc

    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(4, 4))
    scope = layerscope.watch(model, every=1)
    model(torch.randn(2, 4)).sum().backward()
    assert _current_stance() == "force_eager"
    pipeline = scope._pipeline
    del scope, model
    gc.collect()
    assert _current_stance() == "default"
    pipeline.close(lambda *counts: layerscope.sinks._base.RunSummary("failed", 0.0, 0, 0, 0, 0))
