"""The validated configuration of a watch, built from ``watch()``'s arguments."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from layerscope._limits import MAX_COUNT, MAX_STEP, Bound, check_within
from layerscope._schedule import Schedule, parse_every
from layerscope.health import AlertsConfig, parse_alerts
from layerscope.model import Kind, Selection, check_types, parse_kinds, parse_rules
from layerscope.stats import (
    HistogramSpec,
    LinearHistogram,
    StatSelection,
    log2_bin_edges,
    parse_histogram,
    parse_stats,
)

# What ``watch(ranks=...)`` takes: each rank's rows its own, or merged into whole-job rows.
RANKS = ("each", "merge")


@dataclass(frozen=True, kw_only=True, slots=True)
class WatchConfig:
    """What to record, of which modules, and when."""

    schedule: Schedule
    kinds: frozenset[Kind]
    selection: Selection
    stats: StatSelection
    histogram: HistogramSpec | None
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    ranks: str = "each"  # "each": a rank's rows are its own; "merge": whole-job rows
    start_step: int = 0  # the first step's number: a resumed training's global step
    # The gradient noise scale: False (off), True (micro-batch size inferred) or that size.
    noise_scale: bool | int = False
    attention: bool = False  # per-head attention entropy of recorded steps

    @classmethod
    def from_arguments(
        cls,
        *,
        has_optimizer: bool,
        every: object,
        kinds: object,
        include: object,
        exclude: object,
        types: object,
        stats: object,
        histogram: object,
        alerts: object = True,
        ranks: object = "each",
        start_step: object = 0,
        noise_scale: object = False,
        attention: object = False,
        root: nn.Module | None = None,
    ) -> WatchConfig:
        """Validate ``watch()``'s arguments; errors name the argument and what was expected.

        ``root`` is the unwrapped model: module objects in ``include`` and ``exclude`` are
        found in it now, so that the saved config names them.
        """
        parsed_stats = parse_stats(stats)
        spec = parse_histogram(histogram)
        parsed_kinds = parse_kinds(kinds, has_optimizer)
        check_stats_kinds(parsed_stats, parsed_kinds)
        return cls(
            schedule=parse_every(every),
            kinds=parsed_kinds,
            selection=Selection(
                include=parse_rules(include, "include", root),
                exclude=parse_rules(exclude, "exclude", root),
                types=check_types(types),
            ),
            stats=parsed_stats,
            histogram=spec if "hist" in parsed_stats.builtin else None,
            alerts=parse_alerts(alerts),
            ranks=parse_ranks(ranks),
            start_step=parse_start_step(start_step),
            noise_scale=parse_noise_scale(noise_scale),
            attention=parse_attention(attention),
        )

    def histogram_edges(self) -> list[float] | None:
        """Lower edge of each histogram slot, saved with the run for readers."""
        if self.histogram is None:
            return None
        if isinstance(self.histogram, LinearHistogram):
            spec = self.histogram
            width = (spec.hi - spec.lo) / spec.bins
            return [-math.inf] + [spec.lo + k * width for k in range(spec.bins)] + [spec.hi]
        return log2_bin_edges()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, saved with the run."""
        return {
            "every": self.schedule.to_dict(),
            "kinds": sorted(kind.value for kind in self.kinds),
            **self.selection.texts(),  # include, exclude, types
            "stats": list(self.stats.builtin),
            "custom_stats": list(self.stats.custom_columns),
            "custom_stats_by_kind": {
                kind: list(stats) for kind, stats in self.stats.by_kind.items()
            },
            "histogram": histogram_to_dict(self.histogram),
            "alerts": self.alerts.to_dict(),
            "ranks": self.ranks,
            "start_step": self.start_step,
            "noise_scale": self.noise_scale,
            "attention": self.attention,
        }


def check_stats_kinds(stats: StatSelection, kinds: frozenset[Kind]) -> None:
    """Statistics per kind only of kinds that ``kinds=`` records, or a ValueError."""
    missing = [kind for kind in stats.by_kind if Kind(kind) not in kinds]
    if missing:
        recorded = ", ".join(sorted(kind.value for kind in kinds))
        raise ValueError(
            f"stats: statistics for {', '.join(map(repr, missing))}, which kinds= does not "
            f"record (it records {recorded})"
        )


def parse_ranks(ranks: object) -> str:
    """``"each"`` or ``"merge"``, or a ValueError naming ``ranks``."""
    if ranks not in RANKS:
        raise ValueError(f"ranks: expected one of {RANKS}, got {ranks!r}")
    return str(ranks)


def parse_noise_scale(noise_scale: object) -> bool | int:
    """``watch(noise_scale=)``: False, True (the micro-batch size inferred), or an int >= 1."""
    if isinstance(noise_scale, bool):
        return noise_scale
    if not isinstance(noise_scale, int):
        raise TypeError(
            f"noise_scale: expected False, True or the micro-batch size (an int >= 1), "
            f"got {type(noise_scale).__name__}"
        )
    if noise_scale < 1:
        raise ValueError(f"noise_scale: expected a micro-batch size >= 1, got {noise_scale}")
    check_within(noise_scale, "noise_scale", Bound(1, MAX_COUNT))
    return noise_scale


def parse_start_step(start_step: object) -> int:
    """An int from 0 to ``MAX_STEP``, or a TypeError or ValueError naming ``start_step``.

    The bound keeps every step of the run exact in float64 (``run.json``, pandas) and within
    int64, however long it trains.
    """
    if isinstance(start_step, bool) or not isinstance(start_step, int):
        raise TypeError(f"start_step: expected an int >= 0, got {type(start_step).__name__}")
    if start_step < 0:
        raise ValueError(f"start_step: expected an int >= 0, got {start_step}")
    check_within(start_step, "start_step", Bound(0, MAX_STEP))
    return start_step


def histogram_to_dict(spec: HistogramSpec | None) -> dict[str, Any] | None:
    """The histogram spec as data for ``run.json``, not as a repr to parse.

    ``{"kind": "log2", "slots": 256}``, ``{"kind": "linear", "lo": ..., "hi": ..., "bins":
    ...}``, or None.

    Examples:
        >>> histogram_to_dict(LinearHistogram(0.0, 1.0, 4))
        {'kind': 'linear', 'lo': 0.0, 'hi': 1.0, 'bins': 4}
    """
    if spec is None:
        return None
    if isinstance(spec, LinearHistogram):
        return {"kind": "linear", "lo": spec.lo, "hi": spec.hi, "bins": spec.bins}
    return {"kind": "log2", "slots": spec.slots}


def check_model(model: object) -> nn.Module:
    """``model``: any ``nn.Module``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    return model


def parse_attention(attention: object) -> bool:
    """``watch(attention=)``: True or False."""
    if not isinstance(attention, bool):
        raise TypeError(f"attention: expected True or False, got {type(attention).__name__}")
    return attention
