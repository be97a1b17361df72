"""``watch(tensors=...)``, checked: which whole tensors a run keeps, of which modules, when."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from layerscope._limits import MAX_PERIOD_SECONDS, MAX_STEP, Bound, check_within
from layerscope.model import Kind
from layerscope.tensors._options import CaptureOptions

# What the in-run tensors take: capture()'s kinds, and weights read at the end of a step.
KINDS = (Kind.ACTIVATION, Kind.GRAD, Kind.INPUT, Kind.WEIGHT_GRAD, Kind.WEIGHT)
KEYS = (
    "include", "exclude", "types", "kinds", "every", "every_seconds", "stash_value",
    "max_bytes", "keep",
)  # fmt: skip
DEFAULT_KINDS = ("activation", "grad")
DEFAULT_MAX_BYTES = 1 << 30  # of this rank's run: whole tensors fill a disk fast


@dataclass(frozen=True, kw_only=True, slots=True)
class TensorsSpec:
    """The whole tensors a watched run keeps.

    ``options`` holds the capture's part (modules, forward and backward kinds, ``stash_value``,
    ``max_bytes``); ``weights`` whether the chosen modules' own parameters are kept too.
    ``every`` None keeps them on the steps that record statistics; ``every_seconds`` keeps
    those steps at most once in that many seconds (``KeptSteps``).
    """

    options: CaptureOptions
    weights: bool
    every: int | None
    keep: bool
    every_seconds: float | None = None

    def keeps(self, step: int, records_statistics: bool) -> bool:
        """Whether step ``step`` keeps whole tensors by its number (``every_seconds`` aside)."""
        if self.every is None:
            return records_statistics
        return step % self.every == 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, saved in ``run.json``."""
        options = self.options.to_dict()
        kinds = sorted([*options["kinds"], *(["weight"] if self.weights else [])])
        return {
            "include": options["include"],
            "exclude": options["exclude"],
            "types": options["types"],
            "kinds": kinds,
            "every": self.every,
            "every_seconds": self.every_seconds,
            "stash_value": options["stash_value"],
            "max_bytes": options["max_bytes"],
            "keep": self.keep,
        }


class KeptSteps:
    """Which steps keep whole tensors: ``every``'s, at most one in ``every_seconds`` seconds.

    A step is decided once, when first asked (the scope asks as the step begins): it keeps if
    its number says so and ``every_seconds`` have passed since the last step that kept, on
    ``clock``. So a step keeps all its passes or none, and its evaluation keeps with it.

    Examples:
        >>> times = iter([0.0, 0.4, 1.1, 1.5, 2.3])
        >>> spec = parse_tensors({"include": "fc", "every": 1, "every_seconds": 1.0})
        >>> kept = KeptSteps(spec, lambda step: False, clock=lambda: next(times))
        >>> [step for step in range(5) if kept.keeps(step)]
        [0, 2, 4]
    """

    def __init__(
        self,
        spec: TensorsSpec,
        records_statistics: Callable[[int], bool],
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._spec = spec
        self._records_statistics = records_statistics
        self._clock = _now if clock is None else clock
        self._decided: dict[int, bool] = {}
        self._kept_at: float | None = None

    def keeps(self, step: int) -> bool:
        """Whether ``step`` keeps whole tensors; decided the first time it is asked."""
        decided = self._decided.get(step)
        if decided is None:
            decided = self._spec.keeps(step, self._records_statistics(step))
            seconds = self._spec.every_seconds
            if decided and seconds is not None:
                now = self._clock()
                decided = self._kept_at is None or now - self._kept_at >= seconds
                if decided:
                    self._kept_at = now
            self._decided[step] = decided
        return decided

    def forget_before(self, step: int) -> None:
        """Decisions of steps before ``step`` are not asked again: let them go."""
        for old in [known for known in self._decided if known < step]:
            del self._decided[old]


def parse_tensors(tensors: object) -> TensorsSpec | None:
    """``tensors=``: None, a regex (or list) of module names, or a dict of options.

    Errors are TypeErrors or ValueErrors that name ``tensors`` (and the key at fault).

    Examples:
        >>> spec = parse_tensors(r"^fc1$")
        >>> spec.to_dict()["kinds"], spec.every, spec.options.max_bytes
        (['activation', 'grad'], None, 1073741824)
        >>> parse_tensors({"include": "fc", "kinds": ("weight",), "every": 50}).to_dict()["kinds"]
        ['weight']
    """
    if tensors is None:
        return None
    if isinstance(tensors, str | list | tuple):
        tensors = {"include": tensors}
    if not isinstance(tensors, Mapping):
        raise TypeError(
            f"tensors: expected a regex of module names, a list of them, or a dict with keys "
            f"{', '.join(KEYS)}; got {type(tensors).__name__}"
        )
    unknown = sorted(str(key) for key in tensors if key not in KEYS)
    if unknown:
        raise ValueError(f"tensors: unknown key {unknown[0]!r}; expected some of {', '.join(KEYS)}")
    if tensors.get("include") is None and tensors.get("types") is None:
        raise ValueError(
            "tensors: name the modules whose whole tensors to keep (include= or types=); "
            "keeping every layer's would fill memory and disk"
        )
    kinds = _kinds(tensors.get("kinds", DEFAULT_KINDS))
    try:
        options = CaptureOptions.from_arguments(
            include=tensors.get("include"),
            exclude=tensors.get("exclude"),
            types=tensors.get("types"),
            # capture()'s checks need a kind; weights alone hook no pass (see RunTensors)
            kinds=[kind for kind in kinds if kind is not Kind.WEIGHT] or ["activation"],
            condition=None,
            reduction=None,
            stash_value=tensors.get("stash_value"),
            every=1,
            device=None,
            max_bytes=tensors.get("max_bytes", DEFAULT_MAX_BYTES),
        )
    except (TypeError, ValueError) as error:
        raise type(error)(f"tensors: {error}") from None
    if Kind.WEIGHT in kinds and len(kinds) == 1:
        options = _without_pass_kinds(options)
    every = tensors.get("every")
    if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        raise ValueError(f"tensors: every: expected an int >= 1 or None, got {every!r}")
    if every is not None:
        check_within(every, "tensors: every", Bound(1, MAX_STEP))
    seconds = tensors.get("every_seconds")
    if seconds is not None and (
        isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds >= 0
    ):
        raise ValueError(
            f"tensors: every_seconds: expected a number of seconds >= 0 or None, got {seconds!r}"
        )
    if seconds is not None:
        check_within(seconds, "tensors: every_seconds", Bound(0, MAX_PERIOD_SECONDS))
    keep = tensors.get("keep", True)
    if not isinstance(keep, bool):
        raise TypeError(f"tensors: keep: expected True or False, got {keep!r}")
    return TensorsSpec(
        options=options,
        weights=Kind.WEIGHT in kinds,
        every=every,
        keep=keep,
        every_seconds=None if seconds is None else float(seconds),
    )


def _kinds(kinds: object) -> list[Kind]:
    names = ", ".join(kind.value for kind in KINDS)
    items = (kinds,) if isinstance(kinds, str | Kind) else kinds
    if not isinstance(items, list | tuple | set | frozenset):
        raise TypeError(f"tensors: kinds: expected a tuple of kind names ({names}), got {kinds!r}")
    parsed: list[Kind] = []
    for item in items:
        kind = Kind(item) if item in {kind.value for kind in Kind} else None
        if kind not in KINDS:
            raise ValueError(f"tensors: kinds: unknown kind {item!r}; expected some of {names}")
        assert kind is not None
        if kind not in parsed:
            parsed.append(kind)
    if not parsed:
        raise ValueError(f"tensors: kinds: expected at least one of {names}")
    return parsed


def _without_pass_kinds(options: CaptureOptions) -> CaptureOptions:
    """The options with no forward or backward kind: weights only."""
    fields = {name: getattr(options, name) for name in CaptureOptions.__dataclass_fields__}
    return CaptureOptions(**{**fields, "kinds": frozenset()})


def _now() -> float:
    """Seconds for ``every_seconds``: a monotonic clock."""
    return time.monotonic()
