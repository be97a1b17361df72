"""What the JSON files of a run may hold: each field's type and range, declared once.

``_file_checks`` walks these declarations to check a file as it is read, and the tests build
their damaged files from them, a wrong value for every field at every depth: what is checked
and what the checks are tried with come from one table.

The ranges are what a reader can take without failing later, and what a writer can write:

- times are seconds since the epoch, finite, from 1970 (a machine without a clock starts
  there) to 2200, well inside what a timestamp holds (pandas: to 2262);
- durations are finite, from 0 to that same span;
- counts and steps are int64s, as the tables store them;
- a pid is any operating system's: POSIX's ``pid_t`` is a signed 32-bit int (Linux allows
  up to 2**22), and Windows' process ids are 32-bit unsigned, so runs written there hold up
  to 2**32 - 1 (a pid outside ``pid_t`` is never asked about, see ``_status``);
- a rank and a world size are C ints, as every distributed backend keeps them;
- a configuration's numbers are held to the bounds ``watch()`` holds them to (``_limits``):
  a linear histogram of at most ``MAX_LINEAR_BINS`` bins, a ``start_step`` up to ``MAX_STEP``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from layerscope._limits import MAX_COUNT, MAX_LINEAR_BINS, MAX_STEP
from layerscope.stats import BUILTIN_STATS, LOG2_BINS, is_custom_stat_name

INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1
#: 2200-01-01T00:00:00Z, in seconds since the epoch.
LATEST_TIME = 7_258_118_400.0
#: Levels of nesting a file may have; layerscope's own go 6 deep (config.alerts.rules...).
MAX_NESTING = 64
STATUSES = ("running", "finished", "failed", "crashed")


@dataclass(frozen=True, slots=True)
class Integer:
    """An int (not a bool) from ``low`` to ``high``, both included."""

    low: int
    high: int

    def accepts(self, value: Any) -> bool:
        return _is_int(value) and self.low <= value <= self.high

    @property
    def expected(self) -> str:
        if self.high == INT64_MAX:  # said where a value is over it (see _file_checks)
            return f"an integer >= {self.low}"
        return f"an integer from {self.low} to {self.high}"


@dataclass(frozen=True, slots=True)
class Number:
    """An int or a float (not a bool, never NaN) from ``low`` to ``high``.

    ``infinite``: -inf and +inf are taken too (a histogram's outermost edges).
    """

    low: float
    high: float
    infinite: bool = False
    described: str = "a number, finite"

    def accepts(self, value: Any) -> bool:
        if not (_is_int(value) or isinstance(value, float)) or value != value:  # NaN
            return False
        if isinstance(value, float) and math.isinf(value):
            return self.infinite
        # An int is compared as it is: 10**400 is out of range, never an OverflowError.
        return bool(self.low <= value <= self.high)

    @property
    def expected(self) -> str:
        return self.described


@dataclass(frozen=True, slots=True)
class Text:
    """A string; one of ``choices`` if given, one ``test`` takes if given."""

    choices: tuple[str, ...] | None = None
    test: Callable[[str], bool] | None = None
    described: str = "a string"

    def accepts(self, value: Any) -> bool:
        return (
            isinstance(value, str)
            and (self.choices is None or value in self.choices)
            and (self.test is None or self.test(value))
        )

    @property
    def expected(self) -> str:
        return f"one of {', '.join(self.choices)}" if self.choices else self.described


@dataclass(frozen=True, slots=True)
class Flag:
    """true or false."""

    def accepts(self, value: Any) -> bool:
        return isinstance(value, bool)

    @property
    def expected(self) -> str:
        return "true or false"


@dataclass(frozen=True, slots=True)
class AnyObject:
    """A JSON object whose contents no reader uses: kept as it is."""

    def accepts(self, value: Any) -> bool:
        return isinstance(value, dict)

    @property
    def expected(self) -> str:
        return "an object"


@dataclass(frozen=True, slots=True)
class ListOf:
    """A list of items of ``item``, at least ``min_length`` of them."""

    item: Spec
    min_length: int = 0

    @property
    def expected(self) -> str:
        least = f"at least {self.min_length} " if self.min_length else ""
        return f"a list of {least}items, each {self.item.expected}"


@dataclass(frozen=True, slots=True)
class MappingOf:
    """An object whose values are each ``value``."""

    value: Spec

    @property
    def expected(self) -> str:
        return f"an object of values, each {self.value.expected}"


@dataclass(frozen=True, slots=True)
class Field:
    """A field of a ``Record``: what it holds, whether it must be there, whether null is."""

    spec: Spec
    required: bool = False
    null: bool = False


@dataclass(frozen=True, slots=True)
class Record:
    """An object of named fields; fields it does not name are kept unchecked.

    ``tag``: the (field, value) that tells this record from the others of a ``OneOf``.
    ``example``: a valid value, for a ``OneOf`` whose other record a run holds.
    """

    fields: dict[str, Field]
    tag: tuple[str, str] | None = None
    example: dict[str, Any] = field(default_factory=dict)

    @property
    def expected(self) -> str:
        if self.tag is not None:
            return f'an object with "{self.tag[0]}": "{self.tag[1]}"'
        return "an object"


@dataclass(frozen=True, slots=True)
class OneOf:
    """Any one of ``options``; a record is told by its ``tag``."""

    options: tuple[Spec, ...]

    @property
    def expected(self) -> str:
        return " or ".join(option.expected for option in self.options)


Spec = Integer | Number | Text | Flag | AnyObject | ListOf | MappingOf | Record | OneOf

COUNT = Integer(0, INT64_MAX)
TIME = Number(0.0, LATEST_TIME, described="a number of seconds since 1970, before 2200")
DURATION = Number(0.0, LATEST_TIME, described="a number of seconds, finite and >= 0")
TEXT = Text()
TEXTS = ListOf(TEXT)
BUILTIN_STAT = Text(choices=BUILTIN_STATS)
EDGE = Number(-math.inf, math.inf, infinite=True, described="a number")
CUSTOM_STAT = Text(
    test=is_custom_stat_name, described="an identifier that names no column of the stats table"
)

LOG2_HISTOGRAM = Record(
    {"kind": Field(Text(("log2",)), required=True), "slots": Field(Integer(LOG2_BINS, LOG2_BINS))},
    tag=("kind", "log2"),
    example={"kind": "log2", "slots": LOG2_BINS},
)
LINEAR_HISTOGRAM = Record(
    {
        "kind": Field(Text(("linear",)), required=True),
        "lo": Field(Number(-math.inf, math.inf), required=True),
        "hi": Field(Number(-math.inf, math.inf), required=True),
        "bins": Field(Integer(1, MAX_LINEAR_BINS), required=True),
    },
    tag=("kind", "linear"),
    example={"kind": "linear", "lo": 0.0, "hi": 1.0, "bins": 4},
)

CONFIG = Record(
    {
        "every": Field(AnyObject()),
        "kinds": Field(TEXTS),
        "capture": Field(TEXTS),  # kinds, as runs written before the rename name them
        "include": Field(TEXTS),
        "exclude": Field(TEXTS),
        "types": Field(TEXTS),
        "stats": Field(ListOf(BUILTIN_STAT)),
        "custom_stats": Field(ListOf(CUSTOM_STAT)),
        "custom_stats_by_kind": Field(MappingOf(ListOf(CUSTOM_STAT))),
        "histogram": Field(OneOf((LOG2_HISTOGRAM, LINEAR_HISTOGRAM)), null=True),
        "alerts": Field(AnyObject()),
        "ranks": Field(Text(("each", "merge"))),
        "start_step": Field(Integer(0, MAX_STEP)),
        "noise_scale": Field(OneOf((Flag(), Integer(1, MAX_COUNT)))),
        "attention": Field(Flag()),
        "tensors": Field(AnyObject(), null=True),
    }
)

#: ``run.json``. Null is taken where a writer writes it, and older runs lack some fields.
RUN_META = Record(
    {
        "schema": Field(Integer(1, INT64_MAX)),
        "id": Field(TEXT),
        "name": Field(TEXT),
        "status": Field(Text(STATUSES)),
        "started": Field(TIME),
        "ended": Field(TIME, null=True),
        "updated": Field(TIME),
        "heartbeat_seconds": Field(DURATION),
        "user": Field(TEXT),
        "host": Field(TEXT),
        "pid": Field(Integer(1, 2**32 - 1)),
        "rank": Field(Integer(0, INT32_MAX - 1)),
        "world_size": Field(Integer(1, INT32_MAX)),
        "versions": Field(MappingOf(TEXT)),
        "argv": Field(TEXTS),
        "config": Field(CONFIG),
        "histogram_edges": Field(ListOf(EDGE, 2), null=True),
        **{
            name: Field(COUNT)
            for name in (
                "steps",
                "recorded_rows",
                "written_rows",
                "dropped_rows",
                "written_scalars",
                "dropped_scalars",
                "written_alerts",
                "failures",
            )
        },
        "cost_seconds": Field(DURATION),
        "writer_seconds": Field(DURATION),
        "kernel": Field(TEXT, null=True),
        **{
            f"{table}_last_step": Field(COUNT, null=True)
            for table in ("stats", "scalars", "alerts", "attention")
        },
    }
)

#: ``modules.json``: the module tree, one object a module.
MODULES = ListOf(
    Record(
        {
            "name": Field(TEXT, required=True),
            "type": Field(TEXT, required=True),
            "parameters": Field(MappingOf(ListOf(COUNT)), required=True),
            "num_parameters": Field(COUNT, required=True),
            "num_parameters_total": Field(COUNT, required=True),
            "children": Field(TEXTS, required=True),
            "watched": Field(Flag(), required=True),
        }
    )
)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
