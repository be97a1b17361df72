"""The call order of every recorded step whose order differs: a model that branches shows each."""

import torch
from torch import nn

import layerscope


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


def test_an_order_that_stays_is_kept_once():
    model = Branching()
    scope = train(model, steps=4, every=2)  # steps 0 and 2 record, both call a
    frame = scope.frame("calls")
    assert set(frame.step) == {0}
    assert [event.step for event in scope.calls] == [0, 0, 0, 0]


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
    from layerscope.hooks import _gates as gates

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
