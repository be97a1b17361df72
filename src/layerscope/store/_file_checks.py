"""The JSON files of a run, parsed and checked field by field as they are read.

Every field a reader uses is checked against its type here, once, so that nothing after a load
meets a string where it counts on a number: a wrong field is a ``RunFileError`` naming the file
and the field. Names that become SQL identifiers (the statistics' columns) must also be ones
layerscope writes: built-in statistics, or custom ones that are plain identifiers. Fields a
reader does not use are kept as they are.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from typing import Any

from layerscope.model import ModuleInfo
from layerscope.stats import BUILTIN_STATS, LOG2_BINS, is_custom_stat_name
from layerscope.store._damage import RunFileError
from layerscope.store._layout import SCHEMA_VERSION

STATUSES = ("running", "finished", "failed", "crashed")
_COUNTS = (
    "steps",
    "recorded_rows",
    "written_rows",
    "dropped_rows",
    "written_scalars",
    "dropped_scalars",
    "failures",
)
_LAST_STEPS = (
    "stats_last_step",
    "scalars_last_step",
    "alerts_last_step",
    "attention_last_step",
)
_TIMES = ("started", "ended", "updated", "heartbeat_seconds", "cost_seconds", "writer_seconds")
_TEXTS = ("id", "name", "user", "host", "kernel")


def parse_json(path: str, payload: bytes) -> Any:
    """``payload`` (the bytes of the file at ``path``) as JSON, or a RunFileError naming it."""
    if not payload.strip():
        raise RunFileError(path, "the file is empty")
    try:
        return json.loads(payload.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise RunFileError(path, f"not UTF-8 text (byte {error.start})") from None
    except json.JSONDecodeError as error:
        raise RunFileError(path, f"not JSON ({error.msg} at line {error.lineno})") from None


def check_run_meta(path: str, meta: Any) -> dict[str, Any]:
    """``run.json``'s contents, each field a reader uses checked; a RunFileError otherwise.

    Args:
        path: the file, for the error.
        meta: its parsed JSON.
    """
    field = _Fields(path)
    if not isinstance(meta, dict):
        raise RunFileError(path, f"expected a JSON object, got {_shown(meta)}")
    schema = meta.get("schema", 1)
    field.check("schema", schema, _is_count(minimum=1), "an integer >= 1")
    if schema > SCHEMA_VERSION:
        raise RunFileError(
            path,
            f"written by a newer layerscope (schema {schema}); this one reads up to schema "
            f"{SCHEMA_VERSION}",
        )
    for name in _TEXTS:
        field.optional(name, meta, _is_text, "a string")
    field.optional("status", meta, lambda value: value in STATUSES, f"one of {STATUSES}")
    for name in _TIMES:
        field.optional(name, meta, _is_number, "a number")
    for name in _COUNTS:
        field.optional(name, meta, _is_count(), "an integer >= 0")
    for name in _LAST_STEPS:
        field.optional(name, meta, _is_count(), "an integer >= 0")
    field.optional("rank", meta, _is_count(), "an integer >= 0")
    field.optional("world_size", meta, _is_count(minimum=1), "an integer >= 1")
    field.optional("pid", meta, _is_count(), "an integer >= 0")
    field.optional("versions", meta, _is_mapping_of(_is_text), "an object of strings")
    field.optional("argv", meta, _is_list_of(_is_text), "a list of strings")
    config = meta.get("config")
    if config is not None:
        _check_config(field, config)
    edges = meta.get("histogram_edges")
    if edges is not None:
        _check_edges(field, edges, (config or {}).get("histogram"))
    return meta


def check_modules(path: str, entries: Any) -> list[ModuleInfo]:
    """``modules.json``'s entries as the module tree; a RunFileError naming a wrong field."""
    field = _Fields(path)
    if not isinstance(entries, list):
        raise RunFileError(path, f"expected a JSON list of modules, got {_shown(entries)}")
    tree = []
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        where = f"[{index}]"
        if not isinstance(entry, dict):
            raise RunFileError(path, f"expected an object, got {_shown(entry)}", where)
        for name, test, expected in (
            ("name", _is_text, "a string"),
            ("type", _is_text, "a string"),
            ("parameters", _is_mapping_of(_is_list_of(_is_count())), "an object of shapes"),
            ("num_parameters", _is_count(), "an integer >= 0"),
            ("num_parameters_total", _is_count(), "an integer >= 0"),
            ("children", _is_list_of(_is_text), "a list of strings"),
            ("watched", _is_bool, "true or false"),
        ):
            if name not in entry:
                raise RunFileError(path, "missing", f"{where}.{name}")
            field.check(f"{where}.{name}", entry[name], test, expected)
        if entry["name"] in seen:
            raise RunFileError(path, f"{entry['name']!r} is listed twice", f"{where}.name")
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
    """How many slots a run's ``config.histogram`` makes; None where it does not say."""
    if not isinstance(histogram, dict):
        return None
    if histogram.get("kind") == "log2":
        return LOG2_BINS
    if histogram.get("kind") == "linear" and _is_count(minimum=1)(histogram.get("bins")):
        return int(histogram["bins"]) + 2
    return None


def _check_config(field: _Fields, config: Any) -> None:
    field.check("config", config, lambda value: isinstance(value, dict), "an object")
    known = set(BUILTIN_STATS)
    field.optional(
        "stats",
        config,
        _is_list_of(lambda name: name in known),
        f"a list of built-in statistics ({', '.join(BUILTIN_STATS)})",
        prefix="config.",
    )
    field.optional(
        "custom_stats",
        config,
        _is_list_of(is_custom_stat_name),
        "a list of identifiers",
        prefix="config.",
    )
    for name in ("capture", "include", "exclude", "types"):
        field.optional(name, config, _is_list_of(_is_text), "a list of strings", prefix="config.")
    field.optional("ranks", config, _is_text, "a string", prefix="config.")
    field.optional("start_step", config, _is_count(), "an integer >= 0", prefix="config.")
    histogram = config.get("histogram")
    if histogram is not None and histogram_slots(histogram) is None:
        raise RunFileError(
            field.path,
            f'expected {{"kind": "log2"}} or {{"kind": "linear", "bins": N}}, '
            f"got {_shown(histogram)}",
            "config.histogram",
        )


def _check_edges(field: _Fields, edges: Any, histogram: Any) -> None:
    field.check(
        "histogram_edges",
        edges,
        lambda value: _is_list_of(_is_number)(value) and len(value) >= 2,
        "a list of at least two numbers",
    )
    if any(b < a for a, b in itertools.pairwise(edges)):
        raise RunFileError(field.path, "expected increasing edges", "histogram_edges")
    slots = histogram_slots(histogram)
    if slots is not None and len(edges) != slots:
        raise RunFileError(
            field.path,
            f"expected {slots} edges for config.histogram {histogram}, got {len(edges)}",
            "histogram_edges",
        )


class _Fields:
    """Checks of one file's fields, each failure a RunFileError naming file and field."""

    def __init__(self, path: str) -> None:
        self.path = path

    def check(self, name: str, value: Any, test: Callable[[Any], bool], expected: str) -> None:
        if not test(value):
            raise RunFileError(self.path, f"expected {expected}, got {_shown(value)}", name)

    def optional(
        self,
        name: str,
        holder: dict[str, Any],
        test: Callable[[Any], bool],
        expected: str,
        prefix: str = "",
    ) -> None:
        """Check ``holder[name]`` if it is there and not null: older runs lack some fields."""
        value = holder.get(name)
        if value is not None:
            self.check(prefix + name, value, test, expected)


def _is_text(value: Any) -> bool:
    return isinstance(value, str)


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _is_number(value: Any) -> bool:
    """An int or a float, not a bool; infinities pass (histogram edges have them), NaN not."""
    return isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value)


def _is_count(minimum: int = 0) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _is_list_of(test: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, list) and all(test(item) for item in value)


def _is_mapping_of(test: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: (
        isinstance(value, dict)
        and all(isinstance(key, str) and test(item) for key, item in value.items())
    )


def _shown(value: Any) -> str:
    """``value`` for a message: its repr, cut short, and its JSON type."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    kind = {dict: "object", list: "list", str: "string", bool: "boolean"}.get(type(value))
    kind = kind or ("null" if value is None else "number")
    return f"{kind} {text}"
