"""The call order of every recorded step: logged on the training thread, sent once per change.

Each recorded step's first training pass logs the enter and exit of every watched module. A
step whose order is the one sent before it (most models call their modules alike every step)
is sent as one event, ``same``, that names the step; a step whose order differs is sent whole.
So every recorded step is named, and the events of any of them are those of the latest step
at or before it that was sent whole. Readers expand the ``same`` events (``expand_orders``
here; the store's ``calls`` table and view likewise).
"""

from __future__ import annotations

from collections.abc import Iterable

from layerscope.model import CallEvent
from layerscope.recording import Target
from layerscope.sinks import Records
from layerscope.writer import Pipeline

#: The event of a step whose order is the one sent before it (the store reads the same word).
SAME = "same"


class CallLog:
    """The call order of the step in progress, and those sent so far (``same`` kept short).

    Args:
        pipeline: where each step's order goes, when the step ends.
    """

    def __init__(self, pipeline: Pipeline) -> None:
        self._pipeline = pipeline
        self.events: list[CallEvent] = []  # the step in progress, so far
        self._sent: list[CallEvent] = []  # as sent: whole orders and ``same`` events
        self._last_order: list[tuple[str, str, int]] | None = None

    @property
    def sent_any(self) -> bool:
        """Whether a step's order has been sent."""
        return bool(self._sent)

    def log(self, step: int, event: str, target: Target, call: int) -> None:
        """A watched module entered (``enter``) or left (``exit``) its forward."""
        self.events.append(CallEvent(step, len(self.events), event, target.name, call))

    def send(self) -> None:
        """Send the order of the step in progress, or ``same`` if it is the last one sent."""
        events, self.events = self.events, []
        if not events:
            return  # the step had no recorded training pass
        order = _order(events)
        if order == self._last_order:
            events = [CallEvent(events[0].step, 0, SAME, "", 0)]
        else:
            self._last_order = order
        self._sent += events
        self._pipeline.submit(Records(calls=events))

    def every_step(self) -> list[CallEvent]:
        """Every step's order sent so far, whole, then the events of the step in progress."""
        return [*expand_orders(self._sent), *self.events]


def expand_orders(events: Iterable[CallEvent]) -> list[CallEvent]:
    """``events`` with each ``same`` event replaced by the order it repeats, under its step.

    Examples:
        >>> log = [CallEvent(0, 0, "enter", "a", 0), CallEvent(0, 1, "exit", "a", 0),
        ...        CallEvent(1, 0, SAME, "", 0)]
        >>> [(e.step, e.seq, e.event) for e in expand_orders(log)]
        [(0, 0, 'enter'), (0, 1, 'exit'), (1, 0, 'enter'), (1, 1, 'exit')]
    """
    expanded: list[CallEvent] = []
    last: list[CallEvent] = []  # the order sent whole last
    for event in events:
        if event.event != SAME:
            if last and last[-1].step != event.step:
                last = []
            last.append(event)
            expanded.append(event)
        else:
            expanded += [CallEvent(event.step, e.seq, e.event, e.module, e.call) for e in last]
    return expanded


def _order(calls: list[CallEvent]) -> list[tuple[str, str, int]]:
    """What makes two steps' call orders the same: their events, whatever the step."""
    return [(c.event, c.module, c.call) for c in calls]
