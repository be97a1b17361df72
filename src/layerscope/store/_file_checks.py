"""The JSON files of a run, parsed and checked field by field as they are read.

Every field is checked against its declaration in ``_file_schema`` (type and range), at every
depth, once, so that nothing after a load meets a string where it counts on a number, an
infinite time or a step no table can hold: a wrong field is a ``RunFileError`` naming the
file and the field. Names that become SQL identifiers (the statistics' columns) must also be
ones layerscope writes: built-in statistics, or custom ones that are plain identifiers.
Fields the schema does not name are kept as they are.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from typing import Any

from layerscope.model import ModuleInfo
from layerscope.stats import LOG2_BINS, LinearHistogram
from layerscope.store._damage import RunFileError
from layerscope.store._file_schema import (
    INT64_MAX,
    MAX_NESTING,
    MODULES,
    RUN_META,
    Integer,
    ListOf,
    MappingOf,
    OneOf,
    Record,
    Spec,
)
from layerscope.store._layout import SCHEMA_VERSION

# A JSON string, escapes and all: brackets inside one are no nesting.
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
# +1 for an opening bracket, -1 for a closing one, by byte.
_DEPTH_STEP = [0] * 256
for _byte in b"[{":
    _DEPTH_STEP[_byte] = 1
for _byte in b"]}":
    _DEPTH_STEP[_byte] = -1
_NOT_BRACKETS = bytes(byte for byte in range(256) if byte not in b"[]{}")


def parse_json(path: str, payload: bytes) -> Any:
    """``payload`` (the bytes of the file at ``path``) as JSON, or a RunFileError naming it.

    A file nested deeper than any layerscope writes is refused before it is parsed: Python's
    parser recurses once a level, and 100,000 levels would raise a RecursionError (or, with
    a raised recursion limit, overflow the C stack).
    """
    if not payload.strip():
        raise RunFileError(path, "the file is empty")
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RunFileError(path, f"not UTF-8 text (byte {error.start})") from None
    if nested_deeper(payload, MAX_NESTING):
        raise RunFileError(path, f"nested more than {MAX_NESTING} levels deep")
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise RunFileError(path, f"not JSON ({error.msg} at line {error.lineno})") from None
    except (ValueError, RecursionError) as error:  # a number of over 4,300 digits
        raise RunFileError(path, f"not JSON a reader can take ({error})") from None


def nested_deeper(payload: bytes, levels: int) -> bool:
    """Whether the arrays and objects of a JSON text go deeper than ``levels``.

    Brackets in strings are no nesting; the count stops at the first bracket too deep.

    Examples:
        >>> text = b'{"a": [1, {"b": "[[[[["}]}'
        >>> nested_deeper(text, 2), nested_deeper(text, 3)
        (True, False)
    """
    depth = 0
    for byte in _STRING.sub(b"", payload).translate(None, _NOT_BRACKETS):
        depth += _DEPTH_STEP[byte]
        if depth > levels:
            return True
    return False


def check_run_meta(path: str, meta: Any) -> dict[str, Any]:
    """``run.json``'s contents, every field checked; a RunFileError otherwise.

    Args:
        path: the file, for the error.
        meta: its parsed JSON.
    """
    if not isinstance(meta, dict):
        raise RunFileError(path, f"expected a JSON object, got {_shown(meta)}")
    # First: a newer layerscope's run may hold other fields, and should say so.
    _check(path, RUN_META.fields["schema"].spec, meta.get("schema", 1), "schema")
    if meta.get("schema", 1) > SCHEMA_VERSION:
        raise RunFileError(
            path,
            f"written by a newer layerscope (schema {meta['schema']}); this one reads up to "
            f"schema {SCHEMA_VERSION}",
        )
    _check(path, RUN_META, meta, "")
    rank, world_size = meta.get("rank"), meta.get("world_size")
    if rank is not None and world_size is not None and rank >= world_size:
        raise RunFileError(
            path, f"expected a rank below world_size {world_size}, got {rank}", "rank"
        )
    config = meta.get("config") or {}
    histogram = config.get("histogram")
    if isinstance(histogram, dict) and histogram["kind"] == "linear":
        _check_linear(path, histogram)
    edges = meta.get("histogram_edges")
    if edges is not None:
        _check_edges(path, edges, histogram)
    return meta


def check_modules(path: str, entries: Any) -> list[ModuleInfo]:
    """``modules.json``'s entries as the module tree; a RunFileError naming a wrong field."""
    if not isinstance(entries, list):
        raise RunFileError(path, f"expected a JSON list of modules, got {_shown(entries)}")
    _check(path, MODULES, entries, "")
    tree = []
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        if entry["name"] in seen:
            raise RunFileError(path, f"{entry['name']!r} is listed twice", f"[{index}].name")
        seen.add(entry["name"])
        tree.append(
            ModuleInfo(
                name=entry["name"],
                type=entry["type"],
                parameters={key: tuple(shape) for key, shape in entry["parameters"].items()},
                num_parameters=entry["num_parameters"],
                num_parameters_total=entry["num_parameters_total"],
                children=tuple(entry["children"]),
                watched=entry["watched"],
            )
        )
    return tree


def histogram_slots(histogram: Any) -> int | None:
    """How many slots a run's checked ``config.histogram`` makes; None where it has none."""
    if not isinstance(histogram, dict):
        return None
    if histogram.get("kind") == "log2":
        return LOG2_BINS
    return int(histogram["bins"]) + 2


def _check(path: str, spec: Spec, value: Any, where: str) -> None:
    """``value``, at ``where`` in the file, checked against ``spec`` and all it holds."""
    if isinstance(spec, Record):
        if not isinstance(value, dict):
            raise RunFileError(path, f"expected {spec.expected}, got {_shown(value)}", where)
        for name, field in spec.fields.items():
            inner = _join(where, name)
            if name not in value:
                if field.required:
                    raise RunFileError(path, "missing", inner)
                continue
            if value[name] is None and field.null:
                continue
            _check(path, field.spec, value[name], inner)
    elif isinstance(spec, ListOf):
        if not isinstance(value, list) or len(value) < spec.min_length:
            raise RunFileError(path, f"expected {spec.expected}, got {_shown(value)}", where)
        # A list of plain values (256 edges, a shape) is checked item by item without a call
        # a level: the naming call is only for the item refused.
        accepts = getattr(spec.item, "accepts", None)
        for index, item in enumerate(value):
            if accepts is None or not accepts(item):
                _check(path, spec.item, item, f"{where}[{index}]")
    elif isinstance(spec, MappingOf):
        if not isinstance(value, dict):
            raise RunFileError(path, f"expected {spec.expected}, got {_shown(value)}", where)
        for key, item in value.items():
            _check(path, spec.value, item, _join(where, key))
    elif isinstance(spec, OneOf):
        option = _option(spec, value)
        if option is None:
            raise RunFileError(path, f"expected {spec.expected}, got {_shown(value)}", where)
        _check(path, option, value, where)
    elif not spec.accepts(value):
        expected = spec.expected
        if isinstance(spec, Integer) and _over(value, spec.high):
            expected = f"an integer <= {spec.high}" + (" (2**63 - 1)" * (spec.high == INT64_MAX))
        raise RunFileError(path, f"expected {expected}, got {_shown(value)}", where)


def _option(spec: OneOf, value: Any) -> Spec | None:
    """The option of ``spec`` that ``value`` is meant as: a record by its tag, else any taker."""
    for option in spec.options:
        if isinstance(option, Record):
            tag = option.tag
            if tag is not None and isinstance(value, dict) and value.get(tag[0]) == tag[1]:
                return option
        elif not isinstance(option, ListOf | MappingOf | OneOf) and option.accepts(value):
            return option
    return None


def _over(value: Any, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > high


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def _check_linear(path: str, histogram: dict[str, Any]) -> None:
    """A linear histogram's bounds as ``watch()`` takes them: finite, lo < hi, bins > 0 wide."""
    try:
        LinearHistogram(histogram["lo"], histogram["hi"], histogram["bins"])
    except ValueError as error:
        raise RunFileError(
            path, str(error).removeprefix("histogram: "), "config.histogram"
        ) from None


def _check_edges(path: str, edges: list[Any], histogram: Any) -> None:
    """Edges in order, finite but for the outermost ones, one for each slot of the histogram.

    A linear histogram's first slot starts at -inf, a log2 one's last at +inf: the other
    edges are finite, or a slot has no width to draw.
    """
    inner = [edges[0] != math.inf, *map(math.isfinite, edges[1:-1]), edges[-1] != -math.inf]
    if not all(inner):
        index = inner.index(False)
        raise RunFileError(
            path,
            f"expected finite edges but for -inf first and +inf last, got {edges[index]} at "
            f"[{index}]",
            "histogram_edges",
        )
    if any(b < a for a, b in itertools.pairwise(edges)):
        raise RunFileError(path, "expected increasing edges", "histogram_edges")
    slots = histogram_slots(histogram)
    if slots is not None and len(edges) != slots:
        raise RunFileError(
            path,
            f"expected {slots} edges for config.histogram {histogram}, got {len(edges)}",
            "histogram_edges",
        )


def _shown(value: Any) -> str:
    """``value`` for a message: its repr, cut short, and its JSON type."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    kind = {dict: "object", list: "list", str: "string", bool: "boolean"}.get(type(value))
    kind = kind or ("null" if value is None else "number")
    return f"{kind} {text}"
