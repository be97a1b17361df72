"""Rows whose log2 histogram was counted split by sign, finalised: magnitudes and negative half."""

from __future__ import annotations

import torch
from tests.stats.stats_reference import log2_reference, signed_log2_reference

from layerscope.model import Form, Identities, Identity, Kind
from layerscope.stats import WIDTH, SignedLog2Histogram, parse_stats, tensor_partials
from layerscope.writer._merging import Merged, finalize_merged, split_merged

VALUES = (torch.tensor([-8895.0, -2.0, -0.0, 0.0, 0.25, 3.0]), torch.tensor([-1.5, 1e-40, 7.0]))


def _merged(identities: Identities) -> Merged:
    """One training row of step 0 and one evaluation row of step 1, each of its own values."""
    rows, keys = [], []
    for step, (phase, values) in enumerate(zip(("train", "eval"), VALUES, strict=True)):
        row, hist = tensor_partials(values, SignedLog2Histogram())
        rows.append(torch.cat([row, hist.double()]))
        identity = Identity(phase, "lin", "Linear", Kind.ACTIVATION, "out", 0)
        keys.append([step, identities.code(identity)])
    form = identities.form_code(Form("float32", (6,)))
    return Merged(torch.tensor(keys), torch.tensor([form, form]), torch.stack(rows), None, True)


def test_finalised_rows_hold_the_magnitudes_and_the_negative_half():
    identities = Identities()
    rows = finalize_merged(_merged(identities), 0, parse_stats(None), identities)
    assert rows.hist is not None
    assert rows.negative is not None
    for index, values in enumerate(VALUES):
        want = signed_log2_reference(values.double().numpy())
        assert rows.negative[index].tolist() == want[256:].tolist()
        assert rows.hist[index].tolist() == log2_reference(values.double().numpy()).tolist()
    assert rows.hist.shape == (2, 256)  # the run's slots: what the store and readers know


def test_rows_kept_for_a_later_flush_stay_split():
    identities = Identities()
    merged = _merged(identities)
    done, kept = split_merged(merged, identities, open_steps=(1, 1), evaluated=False)
    assert done is not None
    assert kept is not None
    assert done.signed
    assert kept.signed
    assert kept.rows.shape[1] == WIDTH + 512
    assert torch.equal(torch.cat([done.rows, kept.rows]), merged.rows)
