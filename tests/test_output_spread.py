"""The spread of the model's output: against float64, and as the scalars of recorded steps."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from torch import nn

import layerscope
from layerscope.hooks._output_spread import ROWS, output_spread


def _float64_spread(rows: torch.Tensor) -> float:
    """The share of the variance that varies across rows, per column, as a root: by hand."""
    rows = rows.double()
    per_column = ((rows - rows.mean(0)) ** 2).mean(0).mean()
    whole = ((rows - rows.mean()) ** 2).mean()
    return float((per_column / whole).sqrt())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_the_spread_is_the_share_of_the_variance_that_varies_across_samples(dtype):
    generator = torch.Generator().manual_seed(0)
    offsets = torch.randn(10, generator=generator) * 3  # each unit's own, the same for all
    logits = (torch.randn(64, 10, generator=generator) * 0.5 + offsets).to(dtype)
    spread, width = output_spread(logits)
    assert width == 10
    assert spread.dim() == 0
    tolerance = 1e-2 if dtype == torch.bfloat16 else 1e-6
    assert float(spread) == pytest.approx(_float64_spread(logits), rel=tolerance)
    assert 0.05 < float(spread) < 0.5


def test_the_spread_reads_the_first_output_of_two_dimensions_and_its_first_rows():
    tokens = torch.randn(3, ROWS, 5)  # (batch, positions, vocabulary): rows are tokens
    loss = torch.tensor(2.3)
    spread, width = output_spread({"loss": loss, "logits": tokens, "hidden": torch.ones(2, 2)})
    assert width == 5
    assert float(spread) == pytest.approx(_float64_spread(tokens.reshape(-1, 5)[:ROWS]), rel=1e-5)
    assert output_spread((loss, torch.ones(1, 4))) is None  # one row: no spread
    assert output_spread(torch.arange(6).reshape(3, 2)) is None  # integers are no output
    assert float(output_spread(torch.full((8, 3), 2.0))[0]) == 0.0  # the same for every sample


def _classifier_at_chance(labels_follow: bool, deep: bool) -> tuple[list[float], object]:
    """20 steps of a classifier on class patterns in noise, watched or not; its labels follow
    the inputs or are drawn apart from them; a 10-layer ReLU stack (a plateau) or a shallow
    one."""
    torch.manual_seed(0)
    widths = [32] * (10 if deep else 2)
    layers: list[nn.Module] = []
    for width_in, width_out in zip([16, *widths], widths, strict=False):
        layers += [nn.Linear(width_in, width_out), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(32, 10))
    if deep:
        for layer in model[:-1:2]:
            layer.weight.data.mul_(0.5)  # the signal fades through the stack: a plateau
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    patterns = torch.randn(10, 16, generator=generator)
    losses = []
    with layerscope.watch(model, optimizer=optimizer, run=None) as scope:
        for _ in range(20):
            y = torch.randint(0, 10, (64,), generator=generator)
            drawn = torch.randint(0, 10, (64,), generator=generator)
            x = patterns[y] + torch.randn(64, 16, generator=generator)
            loss = nn.functional.cross_entropy(model(x), y if labels_follow else drawn)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step(loss=loss)
            losses.append(float(loss.detach()))
    return losses, scope


def test_labels_drawn_apart_from_their_inputs_are_warned_of_at_the_20th_step():
    _, scope = _classifier_at_chance(labels_follow=False, deep=False)
    alerts = scope.frame("alerts")
    [said] = alerts[alerts.rule == "not_learning"].itertuples()
    assert (said.step, said.severity) == (19, "warning")
    assert "its output varies from sample to sample (a spread of 0." in said.message
    assert "at step 9" in said.message  # the last recorded step of the first 20
    # The spread is the rules' reading: the run keeps the user's scalars only.
    assert set(scope.frame("scalars").name) == {"loss"}


def test_a_plateau_whose_output_is_the_same_for_every_input_stays_a_note():
    losses, scope = _classifier_at_chance(labels_follow=True, deep=True)
    assert abs(statistics.median(losses[-7:]) - math.log(10)) < 0.05  # at chance throughout
    alerts = scope.frame("alerts")
    said = alerts[alerts.rule == "not_learning"]
    assert list(zip(said.step, said.severity, strict=True)) == [(19, "info")]


def test_reading_the_spread_leaves_training_unchanged():
    def losses(watched: bool) -> list[float]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4))
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        x, y = torch.randn(32, 6), torch.randint(0, 4, (32,))
        seen = []
        scope = layerscope.watch(model, optimizer=optimizer, every=3) if watched else None
        for _ in range(7):
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if scope is not None:
                scope.step(loss=loss)
            seen.append(float(loss.detach()))
        if scope is not None:
            scope.close()
        return seen

    assert losses(True) == losses(False)


def test_a_transposed_output_gives_its_first_rows_without_a_copy_of_the_rest():
    # (positions, batch, vocabulary) seen as (batch, positions, vocabulary): not contiguous.
    logits = torch.randn(3 * ROWS, 2, 7).transpose(0, 1)
    assert not logits.is_contiguous()
    spread, width = output_spread(logits)
    assert width == 7
    expected = _float64_spread(logits.reshape(-1, 7)[:ROWS])  # batch 0's first ROWS positions
    assert float(spread) == pytest.approx(expected, rel=1e-5)


def test_the_spread_is_read_no_more_once_no_rule_wants_it(monkeypatch):
    from layerscope.hooks import _output_spread

    read: list[int] = []
    original = _output_spread.output_spread

    def counted(output):
        read.append(1)
        return original(output)

    monkeypatch.setattr(_output_spread, "output_spread", counted)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    alerts = {"not_learning": False}  # its reader is off: the first reading says so
    with layerscope.watch(model, optimizer=optimizer, every=1, alerts=alerts) as scope:
        for _ in range(5):
            model(torch.randn(8, 6)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            scope.step()
    assert len(read) == 1
