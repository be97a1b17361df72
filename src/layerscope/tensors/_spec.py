"""``watch(tensors=...)``, checked: which whole tensors a run keeps, of which modules, when."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from layerscope.model import Kind
from layerscope.tensors._options import CaptureOptions

# What the in-run tensors take: capture()'s kinds, and weights read at the end of a step.
KINDS = (Kind.ACTIVATION, Kind.GRAD, Kind.INPUT, Kind.WEIGHT)
KEYS = ("include", "exclude", "types", "kinds", "every", "stash_value", "max_bytes", "keep")
DEFAULT_KINDS = ("activation", "grad")
DEFAULT_MAX_BYTES = 1 << 30  # of this rank's run: whole tensors fill a disk fast


@dataclass(frozen=True, kw_only=True, slots=True)
class TensorsSpec:
    """The whole tensors a watched run keeps.

    ``options`` holds the capture's part (modules, forward and backward kinds, ``stash_value``,
    ``max_bytes``); ``weights`` whether the chosen modules' own parameters are kept too.
    ``every`` None keeps them on the steps that record statistics.
    """

    options: CaptureOptions
    weights: bool
    every: int | None
    keep: bool

    def keeps(self, step: int, records_statistics: bool) -> bool:
        """Whether step ``step`` keeps whole tensors."""
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
            "stash_value": options["stash_value"],
            "max_bytes": options["max_bytes"],
            "keep": self.keep,
        }


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
    keep = tensors.get("keep", True)
    if not isinstance(keep, bool):
        raise TypeError(f"tensors: keep: expected True or False, got {keep!r}")
    return TensorsSpec(options=options, weights=Kind.WEIGHT in kinds, every=every, keep=keep)


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
