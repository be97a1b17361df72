"""A planted bug: where and when it is, what should be said about it, and how to train it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from diagnosis_zoo.loop import Loop

# The rule families a case may expect: each of layerscope's rules, and the findings no rule
# makes yet, named for the rule that would (a case that expects one is missed until it exists).
FAMILIES = {
    "nonfinite": "a NaN or Inf, and the layer it came from",
    "dead": "outputs that stay zero (dying ReLUs)",
    "vanishing_grad": "gradients far smaller than the layers' after them",
    "exploding_grad": "gradients far larger than their own past or the layers' after them",
    "update_ratio": "updates far too small, zero, or far too large for the weights",
    "activation_drift": "an output's scale far from its first steps'",
    "loss_spike": "the loss jumping above its recent level",
    "attention_collapse": "an attention head collapsed onto single keys",
    "eval_mode": "training forward passes through modules in eval mode",
    "loss_collapse": "the loss falling far below its recent level at once",
    "not_learning": "a loss that does not fall from its start",
    "constant_input": "a model whose input stopped varying",
    "scaler_skips": "a run of optimizer steps skipped by GradScaler",
    "wrong_loss": "an output that is already a probability fed to a loss that expects logits",
    "accumulating_grad": "gradients summed over steps: zero_grad missing",
}


@dataclass(frozen=True, kw_only=True)
class Case:
    """One bug of the zoo, and its healthy twin: the same training without the bug.

    Attributes:
        name: a short name, ``model-bug``.
        model: the model family (MLP, CNN with BatchNorm, ...).
        bug: what is planted, in a sentence.
        family: the rule family (``FAMILIES``) that should name it.
        also: other families whose finding names the same problem (the note says why).
        layers: the module where it is planted or first seen, then any other name for the
            same place; empty where no layer holds it (a bug of the data the loss sees).
        planted: the step it is planted at.
        visible: the first step whose statistics would show it were every step recorded;
            None where no statistic shows it.
        scalar_visible: the first step whose logged scalars show it (the loss, GradScaler's
            skipped steps: logged every step whatever the schedule); None where they do not
            tell this problem.
        build: the training, buggy (True) or healthy (False).
        steps: how many steps it trains.
        origin_until: the last step whose statistics still show the bug at ``layers`` (a NaN
            whose update poisons every weight: later steps show it everywhere); None while
            the bug lasts. Where no recorded step falls from ``visible`` to it, no layer
            can be named from what was recorded, and an alert must name none.
        attention: whether the watch records attention entropy (``attention=True``).
        small: whether ``--small`` runs it.
        note: why that layer and step, where it is not plain.
    """

    name: str
    model: str
    bug: str
    family: str
    also: tuple[str, ...] = ()
    layers: tuple[str, ...]
    planted: int
    visible: int | None = None
    scalar_visible: int | None = None
    build: Callable[[bool], Loop] = field(repr=False, compare=False)
    steps: int = 120
    origin_until: int | None = None
    attention: bool = False
    small: bool = False
    note: str = ""

    def __post_init__(self) -> None:
        for family in (self.family, *self.also):
            if family not in FAMILIES:
                raise ValueError(f"family: expected one of {sorted(FAMILIES)}, got {family!r}")
        shown = [step for step in (self.visible, self.scalar_visible) if step is not None]
        if not shown:
            raise ValueError(f"{self.name}: expected visible or scalar_visible")
        if not all(0 <= self.planted <= step < self.steps for step in shown):
            raise ValueError(
                f"{self.name}: expected 0 <= planted <= visible < steps, got planted "
                f"{self.planted}, visible {self.visible}, scalar_visible "
                f"{self.scalar_visible}, steps {self.steps}"
            )

    @property
    def layer(self) -> str:
        """The layer as the table shows it."""
        return self.layers[0] if self.layers else "(no layer)"
