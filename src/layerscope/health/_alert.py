"""An alert: a health rule's finding about one layer at one step."""

from __future__ import annotations

from dataclasses import dataclass

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
