"""Damaged ``run.json`` and ``modules.json`` files generated from their schema
(``layerscope.store._file_schema``): for every field at every depth, values of the wrong type
and values out of its range; and, as crafted cases (well-formed, any clean answer right), the
extremes each number may take.

A value is put where the field is in the good run's file: in the first module's entry of
``modules.json``, the first item of a list, a key ``x`` of an object (they share a declaration),
and in each kind of record a field may hold (a log2 and a linear histogram). Whether a value is
wrong for its field is decided here (``fits``), from the declaration's type, bounds and choices,
and not by the checks under test.

The rules between fields (edges in order, a rank below the world size) are the hand-written
``RULE_CHANGES``.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import corpus

from layerscope._limits import MAX_LINEAR_BINS
from layerscope.store._file_schema import (
    MODULES,
    RUN_META,
    AnyObject,
    Flag,
    Integer,
    ListOf,
    MappingOf,
    Number,
    OneOf,
    Record,
    Spec,
    Text,
)

#: Levels of nesting of a value that is only nesting: what made Python's parser recurse to death.
DEEP = 100_000
JSONPath = tuple[str | int, ...]
_MARK = "@@the value under test@@"  # in the file's JSON until the value's own text replaces it


class _Deep:
    """The value of ``DEEP`` nested lists, which fits no declaration."""


@dataclass(frozen=True)
class Value:
    """A value to put in a field: its label, its JSON text, and it as Python."""

    label: str
    text: str
    python: Any


def _value(label: str, python: Any) -> Value:
    return Value(label, json.dumps(python), python)


_DEEP = Value("nested-100000", "[" * DEEP + "]" * DEEP, _Deep())
# Of the wrong type for most fields, and out of most ranges: each field takes those that do not
# fit it.
_CANDIDATES = (
    _value("string", "abc"),
    _value("number", 5),
    _value("float", 1.5),
    _value("bool", True),
    _value("list", [1]),
    _value("object", {"x": 1}),
    _value("null", None),
    _DEEP,
    _value("nan", math.nan),
    _value("infinity", math.inf),
    _value("-infinity", -math.inf),
    _value("1e300", 1e300),
    _value("2**63", 2**63),
    _value("10**400", 10**400),
    _value("-1", -1),
)


@dataclass(frozen=True)
class Change:
    """One field of one file changed.

    Attributes:
        file: ``run.json`` or ``modules.json``.
        path: where the field is, keys and indices; () for the whole file.
        value: what it is set to; None removes it.
        start: (path, value) set first: one of the records a field may hold.
        variant: which record ``start`` sets, for the case's name.
    """

    file: str
    path: JSONPath
    value: Value | None
    start: tuple[JSONPath, Any] | None = None
    variant: str = ""

    @property
    def where(self) -> str:
        """The field as the checks name it: ``config.histogram.bins``, ``[1].parameters``."""
        text = ""
        for key in self.path:
            text += f"[{key}]" if isinstance(key, int) else (f".{key}" if text else key)
        return text

    @property
    def label(self) -> str:
        return "missing" if self.value is None else self.value.label

    def apply(self, text: str) -> str:
        """The file's JSON ``text`` with the change made."""
        document = json.loads(text)
        if self.start is not None:
            document = _set(document, *self.start)
        if self.value is None:
            parent = _get(document, self.path[:-1])
            del parent[self.path[-1]]
            return json.dumps(document)
        document = _set(document, self.path, _MARK)
        return json.dumps(document).replace(json.dumps(_MARK), self.value.text)


def _get(document: Any, path: JSONPath) -> Any:
    for key in path:
        document = document[key]
    return document


def _set(document: Any, path: JSONPath, value: Any) -> Any:
    """``document`` with ``value`` at ``path``: missing objects and lists made, a list's next
    index appended."""
    if not path:
        return value
    container = document
    for key, following in itertools.pairwise(path):
        if isinstance(container, list) and key == len(container):
            container.append([] if isinstance(following, int) else {})
        elif isinstance(container, dict) and container.get(key) is None:
            container[key] = [] if isinstance(following, int) else {}
        container = container[key]
    last = path[-1]
    if isinstance(container, list) and last == len(container):
        container.append(value)
    else:
        container[last] = value
    return document


# ---------------------------------------------------------------- what fits a declaration


def fits(spec: Spec, value: Any, null: bool = False) -> bool:
    """Whether ``value`` is one ``spec`` declares (``null``: None is), by its type and range."""
    if value is None:
        return null
    if isinstance(value, _Deep):
        return False
    if isinstance(spec, Integer):
        return type(value) is int and spec.low <= value <= spec.high
    if isinstance(spec, Number):
        if type(value) not in (int, float) or value != value:
            return False
        if isinstance(value, float) and math.isinf(value):
            return spec.infinite
        return bool(spec.low <= value <= spec.high)
    if isinstance(spec, Text):
        return (
            type(value) is str
            and (spec.choices is None or value in spec.choices)
            and (spec.test is None or spec.test(value))
        )
    if isinstance(spec, Flag):
        return type(value) is bool
    if isinstance(spec, AnyObject):
        return type(value) is dict
    if isinstance(spec, ListOf):
        return (
            type(value) is list
            and len(value) >= spec.min_length
            and all(fits(spec.item, item) for item in value)
        )
    if isinstance(spec, MappingOf):
        return type(value) is dict and all(fits(spec.value, item) for item in value.values())
    if isinstance(spec, Record):
        return (
            type(value) is dict
            and all(name in value for name, f in spec.fields.items() if f.required)
            and all(fits(f.spec, value[n], f.null) for n, f in spec.fields.items() if n in value)
        )
    return any(fits(option, value) for option in spec.options)


def wrong_values(spec: Spec, null: bool = False) -> list[Value]:
    """The candidates that ``spec`` does not declare, and its bounds' neighbours outside."""
    candidates = list(_CANDIDATES)
    if isinstance(spec, Integer):
        candidates += [_value("below", spec.low - 1), _value("above", spec.high + 1)]
    elif isinstance(spec, Number):
        if math.isfinite(spec.low):
            candidates.append(_value("below", spec.low - 1.0))
        if math.isfinite(spec.high):
            candidates.append(_value("above", spec.high + 1.0))
    elif isinstance(spec, Text):
        candidates += [
            _value("unknown", "no-such-value"),
            _value("not-an-identifier", "x; drop table stats"),
            _value("a-column", "step"),
        ]
    elif isinstance(spec, ListOf) and spec.min_length:
        candidates.append(_value("short", []))
    wrong: dict[str, Value] = {}
    for value in candidates:
        if not fits(spec, value.python, null):
            wrong.setdefault(value.text, value)
    return list(wrong.values())


# ---------------------------------------------------------------- the changes


def changes(file: str, spec: Spec) -> Iterator[Change]:
    """Every wrong value of every field of ``file``, declared by ``spec``, the whole file's
    included."""
    yield from _wrong(file, spec, (), False, None)


# Where a field's record is one of a OneOf's: (the path, the record set first, its name).
_Start = tuple[JSONPath, Any, str] | None


def _wrong(file: str, spec: Spec, path: JSONPath, null: bool, start: _Start) -> Iterator[Change]:
    for value in wrong_values(spec, null):
        yield _change(file, path, value, start)
    yield from _inside(file, spec, path, start)


def _change(file: str, path: JSONPath, value: Value | None, start: _Start) -> Change:
    if start is None:
        return Change(file, path, value)
    return Change(file, path, value, (start[0], start[1]), start[2])


def _inside(file: str, spec: Spec, path: JSONPath, start: _Start) -> Iterator[Change]:
    """The changes of what ``spec`` holds: its fields, its first item, a value, each record."""
    if isinstance(spec, Record):
        for name, declared in spec.fields.items():
            if declared.required:
                yield _change(file, (*path, name), None, start)
            yield from _wrong(file, declared.spec, (*path, name), declared.null, start)
    elif isinstance(spec, ListOf):
        yield from _wrong(file, spec.item, (*path, 0), False, start)
    elif isinstance(spec, MappingOf):
        yield from _wrong(file, spec.value, (*path, "x"), False, start)
    elif isinstance(spec, OneOf):
        for option in spec.options:
            if isinstance(option, Record):
                if start is not None:
                    raise RuntimeError(f"{file}: a record of a record of a OneOf, at {path}")
                variant = option.tag[1] if option.tag else str(spec.options.index(option))
                yield from _inside(file, option, path, (path, option.example, variant))


# Extremes left out: a schema newer than this layerscope's is refused by name, and a rank is
# below the world size (a rule between fields).
_EXTREMES_LEFT_OUT = {("schema",): ("low", "high"), ("rank",): ("high",)}


def extremes(file: str, spec: Spec, path: JSONPath = ()) -> Iterator[Change]:
    """The lowest and highest value of each number of ``file`` (valid values), but in the
    records of a ``OneOf`` (a linear histogram's bins go with the edges of as many slots)."""
    if isinstance(spec, Integer | Number):
        left_out = _EXTREMES_LEFT_OUT.get(path, ())
        for label, bound in (("low", spec.low), ("high", spec.high)):
            if math.isfinite(bound) and label not in left_out:
                yield Change(file, path, _value(label, bound))
    elif isinstance(spec, Record):
        for name, declared in spec.fields.items():
            yield from extremes(file, declared.spec, (*path, name))
    elif isinstance(spec, ListOf):
        yield from extremes(file, spec.item, (*path, 0))
    elif isinstance(spec, MappingOf):
        yield from extremes(file, spec.value, (*path, "x"))
    elif isinstance(spec, OneOf):
        for option in spec.options:
            if isinstance(option, Integer | Number):
                yield from extremes(file, option, path)


#: What the checks refuse though each field fits its declaration: the rules between fields.
RULE_CHANGES = (
    Change("run.json", ("histogram_edges",), _value("256-infinite", [math.inf] * 256)),
    Change("run.json", ("histogram_edges", 1), _value("inner-infinite", math.inf)),
    Change("run.json", ("histogram_edges", 0), _value("first-+infinity", math.inf)),
    Change("run.json", ("histogram_edges", 1), _value("decreasing", -1.0)),
    Change("run.json", ("histogram_edges",), _value("too-few", [0.0, 1.0])),
    Change("run.json", ("rank",), _value("not-below-world-size", 1)),
    Change(
        "run.json",
        ("config", "histogram"),
        _value("lo-above-hi", {"kind": "linear", "lo": 1.0, "hi": 0.0, "bins": 4}),
    ),
    Change(
        "run.json",
        ("config", "histogram"),
        _value("bins-too-narrow", {"kind": "linear", "lo": 0.0, "hi": 1e-320, "bins": 4096}),
    ),
)
DECLARED = {"run.json": RUN_META, "modules.json": MODULES}
#: Every generated damage: the wrong values of every field, then the rules between fields.
DAMAGING = (
    *(change for name, spec in DECLARED.items() for change in changes(name, spec)),
    *RULE_CHANGES,
)
#: The valid extremes of every number.
EXTREMES = tuple(change for name, spec in DECLARED.items() for change in extremes(name, spec))


def _changed(change: Change) -> corpus.Damage:
    def damage(run: Path) -> None:
        path = run / change.file
        path.write_text(change.apply(path.read_text()))

    return damage


def _group(prefix: str, change: Change) -> str:
    """The field's name among the cases: ``gen-run.json-config.histogram(linear).bins``."""
    where = change.where or "whole"
    variant = f"({change.variant})" if change.variant else ""
    return f"{prefix}-{change.file}-{where}{variant}"


def _name(prefix: str, change: Change) -> str:
    return f"{_group(prefix, change)}-{change.label}"


def _running_here(pid: int) -> corpus.Damage:
    """Marked running on this host, by process ``pid``, its heartbeat just now."""

    def damage(run: Path) -> None:
        here = {"status": "running", "ended": None, "host": socket.gethostname(), "pid": pid}
        corpus.set_fields(**here, updated=time.time())(run)

    return damage


def _linear_histogram(bins: int) -> corpus.Damage:
    """A linear histogram of ``bins`` bins in the configuration, its edges beside it."""
    width = 2.0 / bins
    edges = [-math.inf, *(-1.0 + k * width for k in range(bins)), 1.0]
    linear = {"kind": "linear", "lo": -1.0, "hi": 1.0, "bins": bins}
    return corpus.then(
        corpus.set_config(histogram=linear), corpus.set_fields(histogram_edges=edges)
    )


def _cases() -> tuple[corpus.Case, ...]:
    damaged = [
        corpus.Case(_name("gen", change), "generated", _changed(change), (change.file,))
        for change in DAMAGING
    ]
    crafted = [
        corpus.Case(_name("edge", change), "extreme", _changed(change), crafted=True)
        for change in EXTREMES
    ]
    # The liveness check of a run marked running here: a pid past pid_t, the largest pid, this
    # process's own.
    for label, pid in (("2**31", 2**31), ("2**32-1", 2**32 - 1), ("own", os.getpid())):
        name = f"edge-run.json-running-here-pid-{label}"
        crafted.append(corpus.Case(name, "extreme", _running_here(pid), crafted=True))
    crafted.append(
        corpus.Case(
            "edge-run.json-linear-histogram-most-bins",
            "extreme",
            _linear_histogram(MAX_LINEAR_BINS),
            crafted=True,
        )
    )
    return (*damaged, *crafted)


CASES = _cases()
#: The field of each generated case: ``gen-run.json-steps`` of ``gen-run.json-steps-nan``.
GROUP_OF = {
    **{_name("gen", change): _group("gen", change) for change in DAMAGING},
    **{_name("edge", change): _group("edge", change) for change in EXTREMES},
}
