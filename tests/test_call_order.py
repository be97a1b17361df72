"""The call order of every recorded step: a model that branches shows each step's own."""

import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

import layerscope
from layerscope.hooks import _gates as gates


@pytest.fixture(autouse=True)
def nothing_compiled(request, monkeypatch):
    """Uncompiled processes, whatever an earlier test compiled: once anything is compiled the
    hooks stay on for good, and only the first recorded step's order is logged."""
    if "compiled" not in request.node.name:
        monkeypatch.setattr(gates, "user_compiled_anything", lambda: False)


class Branching(nn.Module):
    """Calls ``a`` on even steps and ``b`` on odd ones, ``head`` always."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.head = nn.Linear(3, 3), nn.Linear(3, 3), nn.Linear(3, 1)
        self.odd = False

    def forward(self, x):
        return self.head(self.b(x) if self.odd else self.a(x))


def train(model, path=None, steps=6, every=1):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with layerscope.watch(model, optimizer=optimizer, every=every, run=path, alerts=False) as s:
        for step in range(steps):
            model.odd = step % 2 == 1
            model(torch.ones(2, 3)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    return s


def order(frame, step):
    rows = frame[frame.step == step].sort_values("seq")
    return list(zip(rows.event, rows.module, strict=True))


def test_each_change_of_the_order_is_kept_with_its_step(tmp_path):
    scope = train(Branching(), tmp_path / "run")
    frame = scope.frame("calls")
    assert sorted(set(frame.step)) == [0, 1, 2, 3, 4, 5]  # it changes every step
    assert order(frame, 0) == [("enter", "a"), ("exit", "a"), ("enter", "head"), ("exit", "head")]
    assert order(frame, 1) == [("enter", "b"), ("exit", "b"), ("enter", "head"), ("exit", "head")]
    stored = layerscope.load(tmp_path / "run").calls
    assert stored.drop(columns="rank").reset_index(drop=True).equals(frame)


A_ORDER = [("enter", "a"), ("exit", "a"), ("enter", "head"), ("exit", "head")]
B_ORDER = [("enter", "b"), ("exit", "b"), ("enter", "head"), ("exit", "head")]
# Steps 0-5 call a, a, b, b, a, a: each recorded step's order, written out by hand.
BRANCHES = [False, False, True, True, False, False]
EXPECTED = {0: A_ORDER, 1: A_ORDER, 2: B_ORDER, 3: B_ORDER, 4: A_ORDER, 5: A_ORDER}


def train_branches(path=None, every=1):
    model = Branching()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with layerscope.watch(model, optimizer=optimizer, every=every, run=path, alerts=False) as s:
        for odd in BRANCHES:
            model.odd = odd
            model(torch.ones(2, 3)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    return s


def by_step(events):
    """{step: [(event, module), ...]} of (step, seq, event, module) tuples, in seq order."""
    orders = {}
    for step, _, event, module in sorted(events):
        orders.setdefault(step, []).append((event, module))
    return orders


def frame_orders(frame):
    return by_step(zip(frame.step, frame.seq, frame.event, frame.module, strict=True))


@pytest.mark.parametrize("stored", [False, True], ids=["memory", "stored"])
def test_every_recorded_step_has_its_order(tmp_path, stored):
    scope = train_branches(tmp_path / "run" if stored else None)
    assert frame_orders(scope.frame("calls")) == EXPECTED
    assert by_step((e.step, e.seq, e.event, e.module) for e in scope.calls) == EXPECTED
    assert list(scope.frame("calls").seq[:4]) == [0, 1, 2, 3]  # in step, then seq, order


def test_a_stored_run_reads_every_step_and_stores_each_order_once(tmp_path):
    train_branches(tmp_path / "run")
    run = layerscope.load(tmp_path / "run")
    assert frame_orders(run.calls) == EXPECTED
    query = "select step, seq, event, module from calls"
    assert by_step(run.sql(query).itertuples(index=False)) == EXPECTED
    step_3 = run.sql("select event, module from calls where step = 3 order by seq")
    assert list(step_3.itertuples(index=False, name=None)) == B_ORDER
    # The file keeps a repeated order as one row naming its step; so does calls_stored.
    stored = pq.read_table(tmp_path / "run" / "calls.parquet").to_pydict()
    assert [s for s, e in zip(stored["step"], stored["event"], strict=True) if e == "same"] == [
        1,
        3,
        5,
    ]
    assert len(stored["step"]) == 3 * 4 + 3
    compact = run.sql("select step, event from calls_stored where event = 'same' order by 1")
    assert compact.step.tolist() == [1, 3, 5]


def test_a_memory_runs_sql_reads_every_step():
    memory = layerscope.sinks.MemorySink()
    model = Branching()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with layerscope.watch(model, optimizer=optimizer, every=1, alerts=False, sinks=[memory]):
        for odd in BRANCHES:
            model.odd = odd
            model(torch.ones(2, 3)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    from layerscope.scope._memory_run import MemoryRun

    frame = MemoryRun(memory).sql("select step, seq, event, module from calls")
    assert by_step(frame.itertuples(index=False)) == EXPECTED
    assert [e.step for e in memory.calls if e.event == "same"] == [1, 3, 5]


def test_steps_between_recorded_ones_have_no_order():
    scope = train_branches(every=2)  # steps 0, 2 and 4 record: a, b, a
    orders = frame_orders(scope.frame("calls"))
    assert orders == {0: A_ORDER, 2: B_ORDER, 4: A_ORDER}


def test_an_order_that_stays_is_stored_once_and_read_per_step(tmp_path):
    model = Branching()
    scope = train(model, tmp_path / "run", steps=4, every=2)  # steps 0 and 2, both call a
    assert frame_orders(scope.frame("calls")) == {0: A_ORDER, 2: A_ORDER}
    assert [event.step for event in scope.calls] == [0, 0, 0, 0, 2, 2, 2, 2]
    stored = pq.read_table(tmp_path / "run" / "calls.parquet").to_pydict()
    assert list(zip(stored["step"], stored["event"], strict=True))[-1] == (2, "same")


def test_unrecorded_steps_carry_no_call_order_hooks():
    model = Branching()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with layerscope.watch(model, optimizer=optimizer, every=3, alerts=False) as scope:
        for step in range(3):
            hooked = [bool(m._forward_pre_hooks) for m in (model.a, model.b, model.head)]
            assert any(hooked) == (step == 0), step
            model(torch.ones(2, 3)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    assert set(scope.frame("calls").step) == {0}


def test_a_compiled_models_order_is_its_first_recorded_steps(monkeypatch):
    """Hooks of a compiled model stay as they are: only the first order is logged, whole."""
    monkeypatch.setattr(gates, "user_compiled_anything", lambda: True)
    model = Branching()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with layerscope.watch(model, optimizer=optimizer, every=2, alerts=False) as scope:
        for step in range(4):
            model.odd = step == 2  # the recorded steps 0 and 2 call a, then b
            model(torch.ones(2, 3)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    frame = scope.frame("calls")
    assert set(frame.step) == {0}
    assert order(frame, 0) == [("enter", "a"), ("exit", "a"), ("enter", "head"), ("exit", "head")]
