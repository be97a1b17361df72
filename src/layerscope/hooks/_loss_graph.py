"""The loss's autograd graph, read once: probabilities fed to a loss that expects logits.

On recorded training passes, until the check has run, the hooks tag the autograd node of each
watched module's output with the module's name (inner modules return first, so a node keeps
its innermost module's). At the first ``scope.step`` after such a pass whose scalars hold a
tensor with a graph (the loss, passed undetached as the README does), the graph is walked
from the loss, breadth first and no further than the tagged nodes, the model's outputs: a
``log_softmax`` (``cross_entropy``'s first step) or ``binary_cross_entropy_with_logits``
whose input, through shape changes and casts only, is a softmax or a sigmoid takes
probabilities as logits. The step then gets the scalar ``wrong_loss/<module>`` of the module
whose output that is (``WRONG_LOSSES`` says which pair). After backward a graph keeps its
nodes and their edges (only saved tensors are freed), so the walk costs no recompute and
reads no value: no host sync.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from torch import Tensor

from layerscope.health import WRONG_LOSS_SCALAR, WRONG_LOSSES

Scalars = dict[str, float | Tensor]
_TAG = "layerscope.module"  # the key of a node's metadata that names its module
_MOST_NODES = 256  # the walk stops here: a loss's own graph is small
_MOST_LINKS = 32  # shape changes looked through between a loss and its input
_CODES = {pair: code for code, pair in WRONG_LOSSES.items()}
# Autograd nodes by name, the trailing version number left out.
_LOSSES = {
    "LogSoftmaxBackward": "log_softmax",
    "BinaryCrossEntropyWithLogitsBackward": "binary_cross_entropy_with_logits",
}
_PROBABILITIES = {"SoftmaxBackward": "softmax", "SigmoidBackward": "sigmoid"}
# Nodes that move, select or cast values but keep each one what it was.
_SHAPE_ONLY = frozenset(
    f"{name}Backward"
    for name in (
        "View", "Reshape", "ReshapeAlias", "UnsafeView", "Alias", "Expand", "Squeeze",
        "Unsqueeze", "Permute", "Transpose", "T", "Clone", "ToCopy", "Slice", "Select",
        "AsStrided", "Unfold",
    )
)  # fmt: skip


def _kind(node: Any) -> str:
    return str(node.name()).rstrip("0123456789")


def _inputs(node: Any) -> list[Any]:
    return [next_node for next_node, _ in node.next_functions if next_node is not None]


def _tag(node: Any) -> str | None:
    tag = node.metadata.get(_TAG)
    return tag if isinstance(tag, str) else None


def _probability_in(loss_node: Any) -> tuple[str, str] | None:
    """The probability a loss node takes, looked through shape changes: (kind, module).

    The module is the innermost one whose output the probability is, else the nearest one on
    the way whose output it became, else "" (made outside the watched modules, from an output
    of theirs); None where the input is no probability, or none of the watched modules' work.
    """
    inputs = _inputs(loss_node)
    node = inputs[0] if inputs else None
    module = None
    for _ in range(_MOST_LINKS):
        if node is None:
            return None
        module = _tag(node) or module
        kind = _kind(node)
        if kind in _PROBABILITIES:
            if module is None and not _reaches_a_module(node):
                return None  # another model's, or the data's
            return _PROBABILITIES[kind], module or ""
        if kind not in _SHAPE_ONLY:
            return None
        inputs = _inputs(node)
        node = inputs[0] if len(inputs) == 1 else None
    return None


def _walk(start: Any) -> Iterator[Any]:
    """The nodes from ``start`` on, breadth first, no further than modules' outputs."""
    seen = {id(start)}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        yield node
        if _tag(node) is not None:
            continue  # a module's output: the model's graph lies below it
        for next_node in _inputs(node):
            if id(next_node) not in seen and len(seen) < _MOST_NODES:
                seen.add(id(next_node))
                queue.append(next_node)


def _reaches_a_module(node: Any) -> bool:
    """Whether the graph below ``node`` holds a watched module's output."""
    return any(_tag(below) is not None for below in _walk(node))


def wrong_losses(loss: Tensor) -> dict[str, int]:
    """Each module whose output, a probability, ``loss`` takes as logits, with its code.

    Only probabilities the watched modules made, or made from their outputs (module ``""``):
    a loss of tensors no watched module touched says nothing of the model.
    """
    found: dict[str, int] = {}
    if loss.grad_fn is None:
        return found
    for node in _walk(loss.grad_fn):
        if _kind(node) in _LOSSES:
            probability = _probability_in(node)
            if probability is not None:
                kind, module = probability
                found.setdefault(module, _CODES[kind, _LOSSES[_kind(node)]])
    return found


class LossGraph:
    """The check of the loss's graph, once per watch, and the tags it needs until then.

    Args:
        fail: counts and warns of a monitoring failure.
    """

    def __init__(self, fail: Callable[[str, BaseException], None]) -> None:
        self._fail = fail
        self.pending = True  # read by the hooks: tag outputs until the check has run
        self._tagged = False  # outputs were tagged since the last scope.step

    def tag(self, module: str, output: Tensor) -> None:
        """``output`` is ``module``'s, unless a module inside it returned it first."""
        node: Any = output.grad_fn  # torch types its metadata a method; it is a dict
        try:
            if node is not None:
                node.metadata.setdefault(_TAG, module)
                self._tagged = True
        except Exception as error:  # a node without metadata: the check cannot run
            self.pending = False
            self._fail("tagging the loss's autograd graph", error)

    def with_findings(self, scalars: Scalars) -> Scalars:
        """``scalars``, with the check's findings at the first step that passes a loss's graph."""
        if not self._tagged:
            return scalars  # no recorded training pass since the last step: no tags
        self._tagged = False
        losses = [v for v in scalars.values() if isinstance(v, Tensor) and v.grad_fn is not None]
        if not losses:
            return scalars
        self.pending = False
        found: dict[str, int] = {}
        try:
            for loss in losses:  # the loss, and any of its terms passed with it
                found = {**wrong_losses(loss), **found}
        except Exception as error:
            self._fail("reading the loss's autograd graph", error)
            return scalars
        told = {f"{WRONG_LOSS_SCALAR}/{module}": float(code) for module, code in found.items()}
        return {**scalars, **told} if told else scalars
