"""Attention partials on the writer thread: merged by call across a step's batches, then rows.

A step of many micro-batches makes the same attention calls in each; their per-head partials
merge (counts and sums add, minima take the least) until the step's rows are complete, as the
statistics' rows do, and then become one ``AttentionRow`` per head.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torch import Tensor

from layerscope.model import AttentionRow
from layerscope.recording import Arrived, Batch
from layerscope.stats import ATTENTION_WIDTH, finish_attention, merge_attention

_Key = tuple[int, str, str, int]  # step, phase, module, call


class AttentionMerge:
    """The attention partials of calls whose step may still grow, by step, phase, module, call."""

    def __init__(self) -> None:
        self._open: dict[_Key, tuple[int, Tensor]] = {}  # key -> (keys, heads x width partials)

    def add(self, batches: Sequence[Batch], arrivals: Sequence[Mapping[int, Arrived]]) -> None:
        """Merge in the attention partials of ``batches``, whose buffers have arrived."""
        for batch, arrived in zip(batches, arrivals, strict=True):
            for ref in batch.attention:
                end = ref.offset + ref.heads * ATTENTION_WIDTH
                values = arrived[ref.buffer].values[ref.offset : end].view(ref.heads, -1)
                key = (ref.step, ref.phase, ref.module, ref.call)
                held = self._open.get(key)
                if held is None:
                    self._open[key] = (ref.keys, values)
                else:
                    self._open[key] = (max(held[0], ref.keys), merge_attention(held[1], values))

    def take(
        self, final: bool, open_steps: tuple[int, int], evaluated: bool, rank: int
    ) -> list[AttentionRow]:
        """The rows of the calls that are complete (see ``Batch``), in the order they came."""
        rows: list[AttentionRow] = []
        for key in list(self._open):
            step, phase, module, call = key
            if not final:
                open_step = open_steps[1] if phase == "eval" else open_steps[0]
                if step >= open_step and not (phase == "eval" and evaluated):
                    continue
            keys, partials = self._open.pop(key)
            for head, values in enumerate(finish_attention(partials).tolist()):
                rows.append(AttentionRow(step, phase, rank, module, call, head, keys, *values))
        return rows

    def clear(self) -> None:
        """Forget what waits (its batch failed)."""
        self._open.clear()
