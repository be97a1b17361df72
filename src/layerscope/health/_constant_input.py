"""``constant_input``: a batch whose samples are all one, seen in the first layer's output.

Inputs are not recorded by default, but the first layer's output is, with its histogram. A
layer gives equal outputs for equal inputs, so where every sample of the batch is the same
(a collate step that broadcasts one sample, an index that always picks the same), each of
the output's histogram counts is the batch size times one sample's count: a multiple of it.
A batch that varies meets that by chance about once in ``batch ** (slots - 1)``: the rule asks
for a batch of at least 8 and at least 4 occupied slots, and so judges nothing else.
"""

from __future__ import annotations

from typing import Any, ClassVar

from layerscope.health._alert import Alert, Found
from layerscope.health._codes import MODULE, Codes
from layerscope.health._episodes import Episodes
from layerscope.health._readings import Flush
from layerscope.health._small_ops import take
from layerscope.model import StatsRows

MIN_BATCH = 8  # smaller batches meet the signature by chance too often
MIN_SLOTS = 4  # occupied histogram slots: fewer say too little


class ConstantInput:
    """The first layer's output whose histogram counts are all multiples of the batch size.

    The first layer is the first module to return in a training forward pass (the first
    whose output is recorded); the batch is its output's first dimension. One alert per
    episode; a recorded step whose counts are not all multiples ends it. It has no options.
    """

    name = "constant_input"
    defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, codes: Codes) -> None:
        self._codes = codes
        self._episodes = Episodes()

    def observe(self, flush: Flush) -> list[Found]:
        """Alerts of a flush's rows: the first layer's output at each recorded step."""
        if not len(flush):
            return []
        rows = flush.finite_outputs()
        at = rows.nonzero().flatten()
        if not len(at):
            return []
        names = self._codes.modules.values
        modules = take(flush.field(MODULE), at).tolist()
        seen = {names[module] for module in modules if names[module]}  # the root is the model
        if not seen:
            return []
        first = min(seen, key=self._codes.order.forward)
        chosen = [row for row, module in zip(at.tolist(), modules, strict=True)
                  if names[module] == first]  # fmt: skip
        views = take(flush.view, at).tolist()
        view_of = dict(zip(at.tolist(), views, strict=True))
        found: list[Found] = []
        for row in sorted(chosen, key=lambda row: (view_of[row], row)):
            found += self._judge(flush, view_of[row], row)
        return found

    def _judge(self, flush: Flush, view: int, row: int) -> list[Found]:
        chunk, local = _locate(flush, row)
        measured = equal_samples(chunk, local)
        holds = None if measured is None else measured[0]
        reading = flush.reading(row)
        key = (reading.module, reading.tensor)
        if not self._episodes.observe(key, holds) or measured is None:
            return []
        _, batch, slots = measured
        name = f"{reading.module} ({self._codes.order.type_of(reading.module)})"
        alert = Alert.on(
            reading,
            rule=self.name,
            value=float(batch),
            threshold=float(MIN_BATCH),
            message=(
                f"the {batch} samples of the batch at step {reading.step} are all the same "
                f"input to {name}: each of the {slots} occupied slots of its output "
                f"{reading.tensor}'s histogram counts a multiple of {batch}, as equal samples "
                f"give; check the data pipeline (a collate function or an expand that "
                f"repeats one sample, an index that always picks the same one)"
            ),
        )
        return [(view, (row,), alert)]


def equal_samples(chunk: StatsRows, local: int) -> tuple[bool, int, int] | None:
    """Whether row ``local``'s histogram counts are all multiples of its batch size.

    Returns (whether they are, the batch size, the occupied slots), or None where the row
    cannot tell: no histogram, a batch under ``MIN_BATCH``, under ``MIN_SLOTS`` slots.
    """
    form = chunk.identities.forms[int(chunk.form[local])]
    if chunk.hist is None or not form.has_histogram or len(form.shape) < 2:
        return None
    batch = form.shape[0]
    counts = chunk.hist[local]
    occupied = counts[counts > 0]
    if batch < MIN_BATCH or len(occupied) < MIN_SLOTS:
        return None
    return bool((occupied % batch == 0).all()), batch, len(occupied)


def _locate(flush: Flush, row: int) -> tuple[StatsRows, int]:
    """The chunk that holds the flush's row ``row``, and the row's place in it."""
    for chunk in flush.chunks:
        if row < len(chunk):
            return chunk, row
        row -= len(chunk)
    raise IndexError(row)
