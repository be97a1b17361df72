"""Optimizer updates: after minus before, bit for bit, from a copy reused between steps."""

from __future__ import annotations

import warnings

import torch
from torch import nn

import layerscope
from layerscope.hooks._updates import UpdateSnapshot


def test_updates_equal_after_minus_before_bit_for_bit_across_steps_and_a_cast() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.Linear(5, 2))
    snapshot = UpdateSnapshot()
    previous: list[int] = []
    for step in range(4):
        if step == 2:
            model.double()  # the kept copy no longer fits: taken afresh
        optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
        params = list(model.parameters())
        model(torch.randn(3, 6, dtype=params[0].dtype)).sum().backward()
        params[-1].grad = None  # a parameter the step leaves alone: its update is +0.0
        before = [p.detach().clone() for p in params]
        snapshot.take(params)
        kept = [id(t) for t in snapshot._before or ()]
        optimizer.step()
        updates = snapshot.updates(params)
        assert updates is not None
        for update, param, old in zip(updates, params, before, strict=True):
            assert update.dtype == param.dtype
            expected = param.detach() - old
            assert torch.equal(update, expected)
            assert torch.equal(update.signbit(), expected.signbit())  # equal calls -0.0 0.0
        assert not updates[-1].signbit().any()
        assert snapshot.updates(params) is None  # one reading per copy taken
        if step in (1, 3):  # the same memory as the step before
            assert kept == previous
        previous = kept


def test_a_released_copy_gives_no_update() -> None:
    param = torch.ones(3)
    snapshot = UpdateSnapshot()
    assert snapshot.updates([param]) is None
    snapshot.take([param])
    snapshot.release()
    assert snapshot.updates([param]) is None


def test_the_copy_is_kept_only_between_recorded_steps() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    held = []
    every = layerscope.Schedule(every=4, dense=2)  # records steps 0, 1 and 4
    with layerscope.watch(model, optimizer=optimizer, every=every, kinds=("update",)) as scope:
        for _ in range(5):
            model(torch.randn(2, 4)).pow(2).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            held.append(scope._parameters._snapshots[0]._before is not None)
    # Kept from step 0 into step 1; gone once the next step is not recorded.
    assert held == [True, False, False, False, False]
    assert sorted(set(scope.frame().step)) == [0, 1, 4]


def test_a_failing_parameter_copy_warns_once_and_training_goes_on(monkeypatch):
    def broken(self, params):
        raise RuntimeError("no copy today")

    monkeypatch.setattr(UpdateSnapshot, "take", broken)
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    reference = nn.Linear(4, 3)
    reference.load_state_dict(model.state_dict())
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (model, reference)]
    scope = layerscope.watch(model, optimizer=optimizers[0], every=1, kinds=("weight", "update"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for m, optimizer in ((model, optimizers[0]), (reference, optimizers[1])) * 3:
            m(torch.ones(2, 4)).pow(2).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        scope.close()
    ours = [w for w in caught if issubclass(w.category, layerscope.LayerscopeWarning)]
    assert len(ours) == 1
    assert "no copy today" in str(ours[0].message)
    assert scope.failures == 3
    frame = scope.frame()
    assert set(frame.kind) == {"weight"}
    assert sorted(set(frame.step)) == [0, 1, 2]
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(a, b)
