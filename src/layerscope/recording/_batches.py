"""What the training thread hands the writer: readings of a flush and their buffers' copies."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from layerscope.recording._buffer import Arrived, HostCopy
from layerscope.recording._readings import Readings


class Extreme(NamedTuple):
    """A sentinel reading: the (min, max) pair ``pair`` of buffer ``buffer``."""

    step: int
    identity: int
    form: int
    buffer: int
    pair: int
    numel: int


class AttentionRef(NamedTuple):
    """The per-head partials of one attention call: ``heads`` rows of loose values.

    They are ``heads x width`` float64 values at ``offset`` in buffer ``buffer``'s values.
    """

    step: int
    phase: str
    module: str
    call: int
    keys: int
    heads: int
    buffer: int
    offset: int


@dataclass(slots=True)
class Batch:
    """Readings of one flush and the copies that bring their buffers to the host.

    ``final`` marks the last flush of a step; earlier ones (a step with many forward passes
    flushes when its buffer fills) leave their merged partials to be merged with the next.
    Even then, training rows of steps before ``open_steps[0]`` and evaluation rows of steps
    before ``open_steps[1]`` are complete; ``evaluated`` marks a flush after which all
    evaluation rows are (an evaluation has ended, or a reader asks for its rows) while the
    step's training rows may still grow.
    """

    readings: Readings
    copies: dict[int, HostCopy]
    scalars: list[tuple[int, str, float | tuple[int, int]]] = field(default_factory=list)
    final: bool = True
    extremes: list[Extreme] = field(default_factory=list)
    evaluated: bool = False
    open_steps: tuple[int, int] = (0, 0)  # (training, evaluation)
    attention: list[AttentionRef] = field(default_factory=list)
    signed_log2: bool = False  # the rows' histograms: the log2 one split by sign, 512 slots


def arrive(batch: Batch) -> dict[int, Arrived]:
    """Wait for the batch's copies to reach the host."""
    return {buffer: copy.wait() for buffer, copy in batch.copies.items()}
