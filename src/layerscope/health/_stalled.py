"""Parameters that stop learning: the reasons the training thread noted, step by step.

On each recorded step that an optimizer ended, the training thread notes why each watched
parameter cannot learn (``layerscope.hooks``: frozen, left out of every group, a learning
rate of 0, the module at its name replaced). These are facts, not measurements, so one
recorded step tells. What the parameter was from the first note on is taken as meant (a
backbone frozen before training, a branch the forward pass does not use, a warm-up from a
rate of 0); a parameter that learned and then stopped is a finding, with the step it was last
seen learning. A gradient that no group applies is a finding whenever it is seen, and a module
replaced after ``watch()`` is one where the new module's parameters are in no group, a note
(info) where they are.
"""

from __future__ import annotations

import bisect
import threading
from typing import NamedTuple

from layerscope.health._episodes import Episodes

# The reasons, as the training thread names them.
REPLACED = "replaced"
REPLACED_LEFT_OUT = "replaced_left_out"
FROZEN = "frozen"
NO_GRADIENT = "no_gradient"
NO_GROUP = "no_group"
ZERO_LR = "zero_lr"
# Findings only once a parameter was seen learning: before that, they are what was meant.
_ONCE_LEARNING = frozenset((FROZEN, ZERO_LR))

Pair = tuple[str, str]  # (module, tensor)


class Stall(NamedTuple):
    """A parameter that cannot learn at a step, and why."""

    reason: str
    severity: str  # "warning" or "info"
    since: int | None  # the last noted step it could learn at; None: never seen learning
    key: Pair  # the episode's key: the pair, or (module, "") for the module at its name


class StalledParameters:
    """The notes of the training thread, kept on the writer thread as a timeline of changes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[tuple[int, dict[Pair, str]]] = []  # noted, not yet read
        self._steps: list[int] = []  # the steps at which the states changed, in order
        self._states: list[dict[Pair, str]] = []
        self._since: dict[Pair, int] = {}  # each stalled pair's last step able to learn
        self._last: tuple[int, dict[Pair, str]] | None = None  # the latest note read
        self.episodes = Episodes()

    def note(self, step: int, stalled: dict[Pair, str]) -> None:
        """Take the training thread's note of ``step`` (any thread)."""
        with self._lock:
            self._pending.append((step, stalled))

    def at(self, step: int) -> dict[Pair, str]:
        """The stalled parameters at ``step``: the latest note at or before it."""
        self._read_pending()
        place = bisect.bisect_right(self._steps, step)
        if place > 1:  # a training step's rows come once, in step order: the older are done
            del self._steps[: place - 1], self._states[: place - 1]
        return self._states[0] if place else {}

    def stall(self, pair: Pair, reason: str) -> Stall | None:
        """What a parameter's reason means; None where it is no finding."""
        since = self._since.get(pair)
        if reason in (REPLACED, REPLACED_LEFT_OUT):
            severity = "info" if reason == REPLACED else "warning"
            return Stall(reason, severity, since, (pair[0], ""))
        if reason == NO_GROUP or (reason in _ONCE_LEARNING and since is not None):
            return Stall(reason, "warning", since, pair)
        return None

    def _read_pending(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for step, stalled in sorted(pending, key=lambda note: note[0]):
            if self._last is not None:
                before_step, before = self._last
                for pair in stalled.keys() - before.keys():
                    self._since[pair] = before_step  # it could learn at the note before
                for pair in before.keys() - stalled.keys():
                    self._since.pop(pair, None)
            if not self._states or stalled != self._states[-1]:
                self._steps.append(step)
                self._states.append(stalled)
            self._last = (step, stalled)


def stall_message(stall: Stall, module: str, kind: str, tensor: str, step: int) -> str:
    """What was seen of a stalled parameter, why, and what to try."""
    name = module or "the model"
    after = "watch()" if stall.since is None else f"step {stall.since}"
    if stall.reason == REPLACED_LEFT_OUT:
        return (
            f"the module at {name} at step {step} is no longer the {kind} that watch() hooked: "
            f"it was replaced after {after}, and the new module's parameters are in none of "
            f"the optimizer's parameter groups, so they never learn (and the old {kind}'s "
            f"update is 0). Add them with optimizer.add_param_group(), or replace the module "
            f"before making the optimizer; watch() again to record the new module"
        )
    if stall.reason == REPLACED:
        return (
            f"the module at {name} was replaced after {after}: the new one is stepped by the "
            f"optimizer but not watched, so from step {step} its statistics are not recorded; "
            f"watch() again to record it"
        )
    learned = f"learned until step {stall.since} and has not since: at step {step}"
    if stall.reason == FROZEN:
        return (
            f"{name} ({kind}) {tensor} {learned} its requires_grad is False, so it gets no "
            f"gradient and the optimizer skips it (update 0). If the freeze is not meant, set "
            f"requires_grad back to True; a freeze meant for fine-tuning goes before training"
        )
    if stall.reason == ZERO_LR:
        return (
            f"{name} ({kind}) {tensor} {learned} every parameter group that holds it has a "
            f"learning rate of 0, so its update is 0 although it has a gradient. Check that "
            f"group's learning-rate schedule (a factor that reaches 0)"
        )
    return (
        f"{name} ({kind}) {tensor} at step {step} has a gradient but is in none of the "
        f"optimizer's parameter groups, so it never changes (update 0). Add it with "
        f"optimizer.add_param_group(), or set its requires_grad to False if it is meant to stay"
    )
