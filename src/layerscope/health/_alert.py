"""An alert: a health rule's finding about one layer at one step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from layerscope.health._readings import Reading

# Severities, mildest first: "info" notes, "warning" something likely wrong, "error" training
# has gone wrong (non-finite values).
SEVERITIES = ("info", "warning", "error")


@dataclass(frozen=True, slots=True)
class Alert:
    """One row of the ``alerts`` table.

    ``value`` is what the rule measured and ``threshold`` the bound it crossed, in the rule's
    own terms (a zero fraction, a norm, a ratio); ``message`` says it in words.
    """

    step: int
    phase: str
    rule: str
    module: str
    kind: str
    tensor: str
    severity: str
    value: float
    threshold: float
    message: str

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity: expected one of {SEVERITIES}, got {self.severity!r}")

    @classmethod
    def on(
        cls,
        reading: Reading,
        *,
        rule: str,
        value: float,
        threshold: float,
        message: str,
        severity: str = "warning",
        kind: str | None = None,
    ) -> Alert:
        """An alert about ``reading``'s tensor at its step; ``kind`` where it is not the row's."""
        return cls(
            step=reading.step,
            phase=reading.phase,
            rule=rule,
            module=reading.module,
            kind=reading.kind if kind is None else kind,
            tensor=reading.tensor,
            severity=severity,
            value=value,
            threshold=threshold,
            message=message,
        )

    @classmethod
    def of_model(
        cls,
        step: int,
        *,
        rule: str,
        value: float,
        threshold: float,
        message: str,
        severity: str = "warning",
        tensor: str = "",
    ) -> Alert:
        """An alert about the model as a whole at training step ``step`` (from its scalars)."""
        return cls(
            step=step,
            phase="train",
            rule=rule,
            module="",
            kind="",
            tensor=tensor,
            severity=severity,
            value=value,
            threshold=threshold,
            message=message,
        )


# An alert of a flush, with where it goes among the flush's: its view's index, then an order
# within the rule (the order the rule judged its rows in, step by step).
Found = tuple[int, tuple[int, ...], Alert]
