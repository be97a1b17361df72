"""The verdict on what the rules said about a case, and the false alarms of its twin.

Only alerts of severity warning or error count: "info" notes are not a diagnosis, and on a
healthy twin they are not an alarm. An alert before the step the bug was planted at is not
about the bug (the twin's alarms count those). Of the rest, the first alert of the expected
family (or of one the case also accepts) is judged, the earliest by step (within a step, the
first the rules raised): its layer must be the case's, and its step at most the second of the
steps at which what was recorded shows the bug (``window``): one recorded step of grace. An
alert between the planting and the first of them is early, and right.

The layer is judged by what was recorded. Where the logged scalars show the bug before any
recorded step does, an alert naming no layer is right about when; it is right about where
if a later alert of the family names the layer by the second recorded step that shows it
(``layer_window``). Where no recorded step shows the layer at all (``Case.origin_until``: a
NaN whose update poisons every weight before a recorded step), the alert must name none: any
layer it names is an innocent one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from diagnosis_zoo.case import Case

ALARMS = ("warning", "error")
VERDICTS = ("right", "wrong rule", "wrong layer", "late", "missed")


@dataclass(frozen=True, slots=True)
class Said:
    """One alert, as far as the score reads it."""

    step: int
    rule: str
    module: str
    severity: str

    def __str__(self) -> str:
        return f"{self.rule} {self.module or '(model)'} @{self.step}"


@dataclass(frozen=True, slots=True)
class Verdict:
    """A case's verdict under one schedule, and the alert it rests on (None: nothing said)."""

    verdict: str
    said: Said | None
    # The first two steps at which what was recorded shows the bug (``window``).
    window: tuple[int, int] | None


def window(case: Case, recorded: Iterable[int]) -> tuple[int, int] | None:
    """The first two steps at which what was recorded shows the bug; None where none does.

    Those are the recorded steps from ``case.visible`` on, and every step from
    ``case.scalar_visible`` on (scalars are logged every step). Where only one step shows
    it, the window is that step alone.
    """
    shown: set[int] = set()
    if case.visible is not None:
        shown.update(step for step in recorded if step >= case.visible)
    if case.scalar_visible is not None:
        shown.update(range(case.scalar_visible, case.steps))
    first = sorted(shown)[:2]
    if not first:
        return None
    return first[0], first[-1]


def layer_window(case: Case, recorded: Iterable[int]) -> tuple[int, int] | None:
    """The first two recorded steps whose statistics show the bug at its layer; None if none.

    The recorded steps from ``case.visible`` on, up to ``case.origin_until`` where it is set.
    """
    if case.visible is None:
        return None
    until = case.steps if case.origin_until is None else case.origin_until + 1
    first = sorted(step for step in recorded if case.visible <= step < until)[:2]
    if not first:
        return None
    return first[0], first[-1]


def alarms(said: Iterable[Said]) -> list[Said]:
    """The alerts of severity warning or error, in the order given."""
    return [alert for alert in said if alert.severity in ALARMS]


def judge(case: Case, said: Sequence[Said], recorded: Iterable[int]) -> Verdict:
    """The verdict on ``said``, the alerts of the buggy run; ``recorded``, its recorded steps."""
    allowed = window(case, recorded)
    relevant = [alert for alert in alarms(said) if alert.step >= case.planted]
    if not relevant:
        return Verdict("missed", None, allowed)
    family = [alert for alert in relevant if alert.rule in (case.family, *case.also)]
    if not family:
        return Verdict("wrong rule", relevant[0], allowed)
    first = family[0]
    if not _right_layer(case, first, family[1:], layer_window(case, recorded)):
        return Verdict("wrong layer", first, allowed)
    if allowed is None or first.step > allowed[1]:
        return Verdict("late", first, allowed)
    return Verdict("right", first, allowed)


def _right_layer(
    case: Case, first: Said, later: Sequence[Said], shown: tuple[int, int] | None
) -> bool:
    """Whether ``first`` (and, where it names no layer before one is seen, ``later``) is right
    about where: ``shown`` is the case's ``layer_window``."""
    if not case.layers:
        return True
    if case.origin_until is not None and shown is None:
        return first.module == ""  # no recorded step shows the layer: naming one is wrong
    if first.module in case.layers:
        return True
    if first.module or shown is None or first.step >= shown[0]:
        return False
    # Said from the scalars before any recorded step showed the layer: named by a later one.
    return any(s.module in case.layers and first.step <= s.step <= shown[1] for s in later)
