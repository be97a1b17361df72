"""The sign split of the log2 histogram: counted where a sink asks for it, and only there.

Checked against numpy (``signed_log2_reference``) over the values the model produced; the rows'
``hist`` stays the magnitudes, bit for bit as without the split.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tests.stats.stats_reference import log2_reference, signed_log2_reference
from torch import nn

import layerscope
from layerscope.model import Identities, Kind
from layerscope.recording import Batch, Recorder, Target
from layerscope.stats import WIDTH, LinearHistogram, Log2Histogram, SignedLog2Histogram


class Keep:
    """A sink that keeps the statistics rows of every flush; ``signed``: it asks for the split."""

    def __init__(self, signed: bool) -> None:
        self.signed_histograms = signed
        self.chunks: list = []

    def start(self, info) -> None:
        pass

    def write(self, records) -> None:
        if records.stats is not None and not records.stats.sentinel:
            self.chunks.append(records.stats)

    def flush(self) -> None:
        pass

    def close(self, summary) -> None:
        pass

    def activation(self, module: str):
        """The (hist, negative) of ``module``'s one activation row, as numpy."""
        for chunk in self.chunks:
            columns = chunk.columns()
            for index, name in enumerate(columns["module"]):
                if name == module and columns["kind"][index] == "activation":
                    negative = chunk.negative
                    return chunk.hist[index].numpy(), (
                        None if negative is None else negative[index].numpy()
                    )
        raise AssertionError(f"no activation row of {module!r}")


def _run(signed: bool) -> tuple[Keep, list[torch.Tensor]]:
    """Two micro-batches of one step through a Linear: its rows merge the two readings."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16))
    outputs: list[torch.Tensor] = []
    model[0].register_forward_hook(lambda module, args, out: outputs.append(out.detach().clone()))
    sink = Keep(signed)
    with layerscope.watch(model, every=1, sinks=[sink], kinds=("activation",)) as scope:
        for _ in range(2):
            batch = torch.randn(5, 8)
            batch[0, :4] = 0.0  # the bias alone: no -0.0, but values of both signs
            model(batch).sum().backward()
        scope.step()
    return sink, outputs


def test_a_sink_that_asks_gets_the_negative_half_of_both_micro_batches():
    sink, outputs = _run(signed=True)
    hist, negative = sink.activation("0")
    values = torch.cat([out.reshape(-1) for out in outputs]).double().numpy()
    want = signed_log2_reference(values)
    assert negative is not None
    np.testing.assert_array_equal(negative, want[256:])
    np.testing.assert_array_equal(hist - negative, want[:256])
    assert negative.sum() == np.count_nonzero(np.signbit(values)) > 0


def test_the_magnitudes_are_the_same_with_the_split_or_without():
    split, _ = _run(signed=True)
    plain, outputs = _run(signed=False)
    hist, negative = plain.activation("0")
    assert negative is None  # not counted: no sink asked
    values = torch.cat([out.reshape(-1) for out in outputs]).double().numpy()
    np.testing.assert_array_equal(hist, log2_reference(values))
    assert split.activation("0")[0].tobytes() == hist.tobytes()  # bit for bit


class _Outlet:
    """A writer queue that keeps batches: its sinks draw signed histograms or not."""

    def __init__(self, signed: bool) -> None:
        self.signed_histograms = signed
        self.batches: list[Batch] = []

    def submit(self, item: Batch) -> None:
        self.batches.append(item)

    def count_dropped(self, rows: int, scalars: int) -> None:
        raise AssertionError("nothing is dropped here")


def _fail(where: str, error: BaseException) -> None:
    raise error


@pytest.mark.parametrize(
    ("histogram", "signed", "counted", "slots"),
    [
        (Log2Histogram(), False, Log2Histogram, 256),  # a run without such a sink: no split
        (Log2Histogram(), True, SignedLog2Histogram, 512),
        (LinearHistogram(-1.0, 1.0, 8), True, LinearHistogram, 10),  # values already
    ],
)
def test_the_recorder_counts_the_split_only_where_its_sinks_ask(
    histogram, signed: bool, counted: type, slots: int
):
    outlet = _Outlet(signed)
    recorder = Recorder(histogram, {}, Identities(), outlet, _fail)
    assert type(recorder.histogram) is counted
    x = torch.tensor([-3.0, -0.0, 0.5, 2.0])
    recorder.record(0, Target("lin", "Linear"), Kind.ACTIVATION, "out", 0, "train", x)
    recorder.flush(final=True)
    (batch,) = outlet.batches
    assert batch.signed_log2 is (counted is SignedLog2Histogram)
    (copy,) = batch.copies.values()
    rows = copy.wait().rows
    assert rows.shape == (1, WIDTH + slots)
    if counted is SignedLog2Histogram:
        want = signed_log2_reference(x.double().numpy())
        np.testing.assert_array_equal(rows[0, WIDTH:].numpy(), want)
