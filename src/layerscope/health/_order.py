"""The layers' order in a forward pass, and their class names."""

from __future__ import annotations

from collections.abc import Sequence

from layerscope.model import CallEvent, ModuleInfo


class ModuleOrder:
    """Where each module's output comes in a forward pass: its exit in the call order.

    The call order of a recorded step says it where layerscope logged one; until then, and for
    modules it lacks, the order of ``named_modules()`` stands in (children after parents,
    which is the exit order only for leaves: parents exit after their children).
    ``version`` grows each time the order changes, for those who keep ranks derived from it.
    """

    def __init__(self, modules: Sequence[ModuleInfo]) -> None:
        self._model_order = {info.name: i for i, info in enumerate(modules)}
        self._types = {info.name: info.type for info in modules}
        self._exits: dict[str, int] = {}
        self.version = 0

    def learn(self, calls: Sequence[CallEvent]) -> None:
        """Take the exit order of a logged call order (first calls only)."""
        exits = [c.module for c in calls if c.event == "exit" and c.call == 0]
        if exits:
            learned = {module: i for i, module in enumerate(exits)}
            if learned != self._exits:
                self._exits = learned
                self.version += 1

    def forward(self, module: str) -> tuple[int, int]:
        """A sort key: earlier in the forward pass first."""
        if module in self._exits:
            return (0, self._exits[module])
        return (1, self._model_order.get(module, len(self._model_order)))

    def called(self, module: str) -> bool:
        """Whether the module has a place in the forward pass to rank it by.

        Once a call order is known, only the modules it holds do: one never called as a
        module (``nn.MultiheadAttention``'s ``out_proj``, whose weight its parent uses
        directly) has no place among the others, and ``named_modules()`` order would put it
        anywhere. Until then, every module is ranked by that order.
        """
        return not self._exits or module in self._exits

    def model(self, module: str) -> int:
        """The module's place in ``named_modules()`` order."""
        return self._model_order.get(module, len(self._model_order))

    def type_of(self, module: str) -> str:
        """The module's class name, or "" if unknown."""
        return self._types.get(module, "")
