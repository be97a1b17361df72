"""A learning rate far too high is found at the first step on weight matrices; parameters
that start at zero keep the warm-up."""

from __future__ import annotations

import torch
from pathologies import mlp, train
from torch import nn


def test_a_rate_far_too_high_is_found_at_the_first_step_but_not_on_a_layer_from_zero():
    model = mlp([8, 16, 16, 1])
    with torch.no_grad():  # a layer initialised to zero: its first update is its whole size
        nn.init.zeros_(model[2].weight)
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0)
    alerts = dict.fromkeys(("dead", "vanishing_grad", "exploding_grad"), False)
    scope = train(
        model, 11, optimizer=optimizer, every=10, capture=("weight", "update"), alerts=alerts
    )  # records 0 and 10
    found = scope.frame("alerts")
    found = found[(found.rule == "update_ratio") & (found.step == 0)]
    # Layer 2 starts at zero, and no gradient reaches layer 0 through it at step 0.
    assert set(zip(found.module, found.tensor, strict=True)) == {("4", "weight")}
    assert (found.value > 0.8).all()
    assert "steps too large" in found.message.iloc[0]
