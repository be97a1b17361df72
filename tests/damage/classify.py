"""What every reader of layerscope does with a run directory, each outcome in one word.

Readers, by family:

- library: ``load`` (the ``Run``'s ``meta``, ``ranks`` aside), the tables ``stats``,
  ``scalars``, ``alerts``, ``calls``, ``sql`` (``select count(*) from stats``) and ``modules``.
  Where ``load`` fails, every other library reader has its outcome.
- cli: ``summary RUN --plain`` and ``runs PARENT --plain``, in this process, their stdout,
  stderr and exit status captured.
- dashboard: every route of ``create_app(PARENT)`` through one ``TestClient`` per run, with
  parameters found on the good base run (``discover_params``): ``/api/runs``, ``/api/runs/run``
  and its ``modules``, ``scalars``, ``alerts``, ``heatmap``, ``series``, ``colordim`` and
  ``distribution``.

Each reader also reads the run the case should read as (its reference, see ``corpus``), and
its answer there is what the damaged run's answer is compared with: rows as multisets
(order aside; NaN equal to NaN), text line by line with paths and column padding aside, JSON
with any ``skipped`` key aside.

A reader *names* a damaged file when its text holds one of the case's ``names``: the run's
folder and the relative path (``run/stats/seg-000002.parquet``, as absolute paths end), or,
for a path with a ``/`` or a suffix, the relative path on its own, not inside another folder
(``no run.json``, but not ``rank-00001/run.json`` for the root's; a bare ``stats`` is in too
many sentences). A name ending in ``/`` is that folder or anything under it. The text
searched: a library error's message (and an ``OSError``'s filename); the ``LayerscopeWarning``
messages issued while the run was loaded and read, and ``Run.skipped``; a command's stderr
and, where it exits 0, its stdout (a listing of the runs it could not read); a dashboard
error's ``error``, or an answer's ``skipped``, ``error``, ``errors`` or ``warnings`` keys,
wherever they are in it.

Every reader is bounded in time (``isolation.READER_SECONDS``); a case that asks for it reads
in a process of its own, bounded in memory too, and as a user who is not root (see
``isolation``).

Outcomes, the first rule that applies:

1. ``injected``: a file ``INJECTED*`` appeared (anywhere under the case's folder, which is
   the working directory while it is read, or in the working directory the classifier was
   started in).
2. ``escape``: a command printed a raw ESC byte (a run's name, host or module name holding
   terminal escapes, shown as they are).
3. ``hang``: the reader gave no answer in its time, or its process gave none.
4. ``traceback``: the library raised an exception other than ``OSError`` or ``ValueError``
   (what ``load`` documents; ``RunFileError`` is a ``ValueError``), or a command let an
   exception escape or printed a traceback.
5. ``500``: the dashboard answered 500 (or its handler raised).
6. ``named``: a clean error that names a damaged file: the library's ``OSError`` or
   ``ValueError``; a command's exit status 2 with exactly one line on stderr besides
   ``warning:`` lines; a dashboard's 4xx JSON ``error``.
7. ``unnamed-error``: any other clean error (one that names no damaged file, a command's
   exit status 1, several lines).
8. ``ok``: the answer equals the reference's; a crafted case's answer is always ok, as it
   is its own reference.
9. ``partial-labelled``: the answer differs, and a damaged file is named beside it. Library
   rows must still be part of what the run recorded (a sub-multiset, zero rows included):
   rows that no file should have given are ``silently-wrong`` even when something is named.
10. ``partial-unlabelled``: nothing named; rows (or lines, or JSON lists) are a non-empty
   part of the reference's.
11. ``silently-wrong``: nothing named, and anything else: rows not recorded (duplicates, null
   keys, other values), zero rows where the reference has some, other text.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import json
import math
import os
import re
import shutil
import tempfile
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import corpus
import folder_names
import isolation
from isolation import bounded

OUTCOMES = (
    "ok",
    "named",
    "partial-labelled",
    "unnamed-error",
    "partial-unlabelled",
    "silently-wrong",
    "500",
    "traceback",
    "hang",
    "escape",
    "injected",
)
BAD = frozenset(OUTCOMES) - {"ok", "named", "partial-labelled"}
FAMILIES = {
    "library": ("load", "stats", "scalars", "alerts", "calls", "sql", "modules"),
    "cli": ("summary", "runs"),
    "dashboard": (
        "ui:runs",
        "ui:run",
        "ui:modules",
        "ui:scalars",
        "ui:alerts",
        "ui:heatmap",
        "ui:series",
        "ui:colordim",
        "ui:distribution",
    ),
}
READERS = tuple(reader for readers in FAMILIES.values() for reader in readers)
_TABLES = ("stats", "scalars", "alerts", "calls")
_COUNT_QUERY = "select count(*) as n from stats"
# Keys of a dashboard answer that say what it could not read.
_LABELS = frozenset(("skipped", "error", "errors", "warnings"))
_HOST = "http://127.0.0.1"  # the app answers loopback names only


@dataclass(frozen=True)
class Reading:
    """What one reader gave.

    Attributes:
        kind: ``value``; ``error``, a clean one (see the module's rules); ``traceback``; or
            ``500``.
        value: the answer, comparable: rows, lines, JSON.
        message: the error's message, or the last line of the traceback and where it was.
        said: what the reader said beside its answer: warnings, ``skipped``, stderr.
        injected: the injected files that appeared while it read.
        compare: how its value is compared with the reference's.
        escaped: a command printed a raw ESC byte.
    """

    kind: str
    value: Any = None
    message: str = ""
    said: str = ""
    injected: tuple[str, ...] = ()
    compare: str = "exact"
    escaped: bool = False


@dataclass(frozen=True)
class Outcome:
    case: str
    reader: str
    outcome: str
    detail: str = ""


# ---------------------------------------------------------------- reading a run


def read_all(
    run: Path, params: Mapping[str, str], folder: Path, readers: Sequence[str] = READERS
) -> dict[str, Reading]:
    """The readings of ``run`` by ``readers``, each bounded in time, with ``folder`` the
    working directory meanwhile."""
    watch = InjectionWatch(folder)
    workdir = folder / "cwd"
    workdir.mkdir(exist_ok=True)
    commands = {
        "summary": ["summary", str(run), "--plain"],
        "runs": ["runs", str(run.parent), "--plain"],
    }
    with _working_directory(workdir):
        readings = _library(run, watch, readers, folder)
        for reader, argv in commands.items():
            if reader in readers:
                reading = bounded(functools.partial(_command, argv, run), folder, _hung)
                readings[reader] = watch.checked(reading)
        readings.update(_dashboard(run, params, watch, readers, folder))
    return readings


def _hung(why: str) -> Reading:
    return Reading("hang", message=why)


class InjectionWatch:
    """Finds ``INJECTED*`` files that appear under ``folder`` or in the starting directory."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.start = Path.cwd()
        self.before = set(self.start.glob(f"{corpus.INJECTED_PREFIX}*"))

    def checked(self, reading: Reading) -> Reading:
        """``reading`` with the files injected since the last check; they are removed."""
        found = [*self.folder.rglob(f"{corpus.INJECTED_PREFIX}*")]
        found += [p for p in self.start.glob(f"{corpus.INJECTED_PREFIX}*") if p not in self.before]
        for path in found:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        if not found:
            return reading
        return dataclasses.replace(reading, injected=tuple(sorted(map(str, found))))


@contextlib.contextmanager
def _working_directory(path: Path) -> Iterator[None]:
    start = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(start)


@contextlib.contextmanager
def _warnings_said(said: list[str]) -> Iterator[None]:
    """Every warning issued meanwhile, as text into ``said``, none raised or shown."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            said.extend(str(warning.message) for warning in caught)


def _call(function: Callable[[], Any], said: list[str]) -> tuple[Any, Reading | None]:
    """``function()``, or the Reading of its failure (a clean error or a traceback)."""
    try:
        with _warnings_said(said):
            return function(), None
    except (OSError, ValueError) as error:
        message = str(error)
        if isinstance(error, OSError) and error.filename is not None:
            message += f" [{error.filename}]"
        return None, Reading("error", message=f"{type(error).__name__}: {message}")
    except Exception as error:
        return None, Reading("traceback", message=last_line(error))


def last_line(error: BaseException) -> str:
    """The traceback's last line, and the innermost line of layerscope it passed."""
    frames = traceback.extract_tb(error.__traceback__)
    ours = [frame for frame in frames if f"layerscope{os.sep}" in frame.filename]
    where = ""
    if ours or frames:
        frame = (ours or frames)[-1]
        where = f" (at {frame.filename.rsplit('src' + os.sep, 1)[-1]}:{frame.lineno})"
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}{where}"


def _library(
    run: Path, watch: InjectionWatch, readers: Sequence[str], folder: Path
) -> dict[str, Reading]:
    import layerscope

    wanted = [reader for reader in FAMILIES["library"] if reader in readers]
    if not wanted:
        return {}
    loading: list[str] = []
    opened, failure = bounded(lambda: _call(lambda: layerscope.load(run), loading), folder,
                              lambda why: (None, _hung(why)))  # fmt: skip
    failure = watch.checked(failure) if failure else None
    if failure is not None:
        return dict.fromkeys(wanted, failure)

    def said(now: list[str]) -> str:
        skipped = getattr(opened, "skipped", {})  # a Run before Run.skipped has none
        return "\n".join([*loading, *now, *(f"{path}: {why}" for path, why in skipped.items())])

    def table(name: str) -> Reading:
        now: list[str] = []
        frame, failure = _call(functools.partial(getattr, opened, name), now)
        return failure or Reading("value", _rows(frame), said=said(now), compare="rows")

    def count() -> Reading:
        now: list[str] = []
        counted, failure = _call(lambda: int(opened.sql(_COUNT_QUERY)["n"].iloc[0]), now)
        return failure or Reading("value", counted, said=said(now), compare="count")

    def modules() -> Reading:
        now: list[str] = []
        listed, failure = _call(lambda: [info.to_dict() for info in opened.modules], now)
        return failure or Reading(
            "value", Counter(plain(listed)), said=said(now), compare="counter"
        )

    meta = {key: value for key, value in opened.meta.items() if key != "ranks"}
    reads: dict[str, Callable[[], Reading]] = {
        "load": lambda: Reading("value", plain(meta), said=said([])),
        **{name: functools.partial(table, name) for name in _TABLES},
        "sql": count,
        "modules": modules,
    }
    return {reader: watch.checked(bounded(reads[reader], folder, _hung)) for reader in wanted}


def plain(value: Any) -> Any:
    """``value`` as hashable plain Python: tuples for sequences and objects, NaN a string."""
    if value is None or value is _NA or value is _NAT:
        return None
    if isinstance(value, dict):
        return tuple(sorted((str(key), plain(item)) for key, item in value.items()))
    if isinstance(value, list | tuple):
        return tuple(plain(item) for item in value)
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return plain(value.tolist())
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return value


try:  # pandas' missing values, to compare as None
    import pandas as _pandas

    _NA: Any = _pandas.NA
    _NAT: Any = _pandas.NaT
except ImportError:  # pragma: no cover - the dataframe extra is there wherever runs are read
    _NA = _NAT = object()


@dataclass(frozen=True)
class Rows:
    """A table's rows: its columns and each row as (column, value) pairs."""

    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...] = field(repr=False)

    def on(self, columns: tuple[str, ...]) -> Counter[tuple[Any, ...]]:
        """The rows, with only ``columns`` (a column it lacks holds ``<no column>``)."""
        index = {name: i for i, name in enumerate(self.columns)}
        return Counter(
            tuple(row[index[name]] if name in index else "<no column>" for name in columns)
            for row in self.rows
        )


def _rows(frame: Any) -> Rows:
    columns = tuple(str(name) for name in frame.columns)
    return Rows(columns, tuple(plain(list(row)) for row in frame.itertuples(index=False)))


def _command(argv: list[str], run: Path) -> Reading:
    """``layerscope ARGV`` in this process: its stdout's lines, or how it failed."""
    from layerscope.cli import main

    out, err = io.StringIO(), io.StringIO()
    try:
        with (
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("always")  # shown by the command, never raised
            status = main(argv)
    except Exception as error:
        return Reading("traceback", message=last_line(error), said=err.getvalue())
    stderr = err.getvalue()
    if "\x1b" in out.getvalue() + stderr:  # a terminal would take it for a command
        return Reading("value", said=stderr, escaped=True)
    if "Traceback (most recent call last)" in stderr:
        lines = [line for line in stderr.strip().splitlines() if line.strip()]
        return Reading("traceback", message=lines[-1], said=stderr)
    if status != 0:
        errors = [line for line in stderr.splitlines() if not line.startswith("warning:")]
        message = errors[0] if len(errors) == 1 else f"exit status {status}: {stderr.strip()!r}"
        if status != 2 or len(errors) != 1:
            message = f"<not one line, or exit status {status}> {message}"
        return Reading("error", message=message, said=stderr)
    # A listing may say in its output which runs it could not read, and why.
    said = f"{stderr}\n{out.getvalue()}"
    return Reading("value", _lines(out.getvalue(), run), said=said, compare="lines")


def _lines(text: str, run: Path) -> tuple[str, ...]:
    """The output's lines with the runs' folder, column padding and rules made alike."""
    text = text.replace(str(run.parent), "<ROOT>")
    lines = []
    for line in text.splitlines():
        line = re.sub(r"-{3,}", "---", re.sub(r" {2,}", "  ", line.rstrip()))
        lines.append(line)
    return tuple(lines)


def discover_params(run: Path) -> dict[str, str]:
    """The dashboard's parameters of a good run: a kind, tensor, phase, rank, statistic, the
    first layer of its heat map and its second recorded step (in the segment cases damage).
    """
    from starlette.testclient import TestClient

    from layerscope.ui._app import create_app

    client = TestClient(create_app(run.parent), base_url=_HOST)
    summary = client.get(f"/api/runs/{run.name}").json()
    kinds = summary["kinds"]
    kind = "activation" if "activation" in kinds else next(iter(kinds))
    params = {
        "kind": kind,
        "tensor": kinds[kind][0],
        "phase": summary["phases"][0],
        "rank": str(summary["ranks"][0]),
        "stat": "absmax" if "absmax" in summary["stats"] else summary["stats"][0],
    }
    heatmap = client.get(f"/api/runs/{run.name}/heatmap?" + urlencode(params)).json()
    params["module"] = heatmap["layers"][0]
    params["step"] = str(heatmap["steps"][min(1, len(heatmap["steps"]) - 1)])
    client.close()
    return params


def routes(run_name: str, params: Mapping[str, str]) -> dict[str, str]:
    """Each dashboard reader's URL."""
    chart = {name: params[name] for name in ("kind", "tensor", "phase", "rank")}
    layer = {**chart, "module": params["module"]}
    base = f"/api/runs/{quote(run_name, safe='')}"
    return {
        "ui:runs": "/api/runs",
        "ui:run": base,
        "ui:modules": f"{base}/modules",
        "ui:scalars": f"{base}/scalars?" + urlencode({"rank": params["rank"]}),
        "ui:alerts": f"{base}/alerts?" + urlencode({"rank": params["rank"]}),
        "ui:heatmap": f"{base}/heatmap?" + urlencode({**chart, "stat": params["stat"]}),
        "ui:series": f"{base}/series?" + urlencode(layer),
        "ui:colordim": f"{base}/colordim?" + urlencode(layer),
        "ui:distribution": f"{base}/distribution?" + urlencode({**layer, "step": params["step"]}),
    }


def _dashboard(
    run: Path,
    params: Mapping[str, str],
    watch: InjectionWatch,
    readers: Sequence[str],
    folder: Path,
) -> dict[str, Reading]:
    from starlette.testclient import TestClient

    from layerscope.ui._app import create_app

    wanted = {r: url for r, url in routes(run.name, params).items() if r in readers}
    if not wanted:
        return {}
    said: list[str] = []
    app, failure = _call(lambda: create_app(run.parent), said)
    if failure is not None:
        failure = Reading("500", message=f"create_app: {failure.message}")
        return {reader: watch.checked(failure) for reader in wanted}
    readings = {}
    # What the server logs (a handler's traceback) is no answer: the client's is judged.
    with TestClient(app, base_url=_HOST) as client, contextlib.redirect_stderr(io.StringIO()):
        for reader, url in wanted.items():
            reading = bounded(functools.partial(_route, client, url), folder, _hung)
            readings[reader] = watch.checked(reading)
    return readings


def _route(client: Any, url: str) -> Reading:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an answer says what it left out, or nothing
            response = client.get(url)
    except Exception as error:  # the test client raises what the app raised: a 500
        return Reading("500", message=last_line(error))
    if response.status_code >= 500:
        return Reading("500", message=response.text[:300])
    try:
        body = response.json()
    except ValueError:
        body = {"error": response.text[:300]}
    if response.status_code >= 400:
        said = body.get("error") if isinstance(body, dict) else None
        return Reading("error", message=f"{response.status_code}: {said or body}")
    said = "\n".join(json.dumps(text) for text in _labels(body))
    return Reading("value", _without_skipped(body), said=said, compare="json")


def _labels(value: Any) -> Iterator[Any]:
    """What an answer says of files it could not read: its ``skipped`` and ``error`` keys."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key in _LABELS:
                yield item
            else:
                yield from _labels(item)
    elif isinstance(value, list):
        for item in value:
            yield from _labels(item)


def _without_skipped(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _without_skipped(item) for key, item in value.items() if key != "skipped"}
    if isinstance(value, list):
        return [_without_skipped(item) for item in value]
    return value


# ---------------------------------------------------------------- judging


def names(case: corpus.Case, text: str) -> bool:
    """Whether ``text`` names a file of ``case.names`` (see the module's docstring)."""
    for name in case.names:
        if name == ".":  # the run's folder itself, as a path names it
            if re.search(rf"/{re.escape(case.folder)}(?![\w./-])", text):
                return True
            continue
        folder = name.endswith("/")
        relative = re.escape(name.rstrip("/"))
        after = r"(?![\w-])" if folder else r"(?![\w/-])"
        patterns = [rf"(?<![\w.-]){re.escape(case.folder)}/{relative}{after}"]
        if "/" in name.rstrip("/") or "." in name:  # a bare "stats" is in too many sentences
            patterns.append(rf"(?<![\w./-]){relative}{after}")
        if any(re.search(pattern, text) for pattern in patterns):
            return True
    return False


def judge(case: corpus.Case, reader: str, reading: Reading, expected: Reading | None) -> Outcome:
    """The outcome of ``reader`` on the case's run, by the module's rules."""

    def outcome(word: str, detail: str = "") -> Outcome:
        return Outcome(case.name, reader, word, detail)

    if reading.injected:
        return outcome("injected", ", ".join(reading.injected))
    if reading.escaped:
        return outcome("escape", "a raw ESC byte in what the command printed")
    if reading.kind in ("traceback", "500", "hang"):
        return outcome(reading.kind, reading.message)
    if reading.kind == "error":
        clean = not reading.message.startswith("<not one line")
        named = clean and names(case, reading.message)
        return outcome("named" if named else "unnamed-error", reading.message)
    if expected is None:
        return outcome("ok")
    if expected.kind != "value":
        return outcome("ok", f"(the reference failed: {expected.message})")
    if reading.compare == "lines":  # what the output says of damaged files is no content
        reading = dataclasses.replace(reading, value=_unlabelled(case, reading.value))
    part = _part(reading.compare, reading.value, expected.value)
    if part == "same":
        return outcome("ok")
    said = _first_named(case, reading.said)
    if said is not None:
        if part == "wrong" and reading.compare == "rows":
            return outcome("silently-wrong", f"rows not recorded, though it said: {said}")
        return outcome("partial-labelled", said)
    if part == "part":
        return outcome("partial-unlabelled", _difference(reading, expected))
    return outcome("silently-wrong", _difference(reading, expected))


def _first_named(case: corpus.Case, said: str) -> str | None:
    for line in said.splitlines():
        if names(case, line):
            return line
    return None


def _unlabelled(case: corpus.Case, lines: tuple[str, ...]) -> tuple[str, ...]:
    """``lines`` without the blocks (between blank lines) that name a damaged file."""
    kept: list[str] = []
    block: list[str] = []
    for line in (*lines, ""):
        if line.strip():
            block.append(line)
            continue
        if not any(names(case, each) for each in block):
            kept += block
        block = []
    return tuple(kept)


def _part(compare: str, value: Any, reference: Any) -> str:
    """``same``; ``part`` (a non-empty part of the reference); ``empty`` (nothing, where the
    reference has something); or ``wrong``."""
    if compare == "rows":
        if value.on(reference.columns) == reference.on(reference.columns):
            return "same"
        mine, theirs = value.on(reference.columns), reference.on(reference.columns)
        return _counted(mine, theirs)
    if compare == "count":
        if value == reference:
            return "same"
        if value > reference:
            return "wrong"
        return "empty" if value == 0 else "part"
    if compare in ("counter", "lines"):
        # Blank lines only part blocks: an output is its other lines, in any order.
        mine = value if compare == "counter" else Counter(line for line in value if line)
        theirs = reference if compare == "counter" else Counter(line for line in reference if line)
        return "same" if mine == theirs else _counted(mine, theirs)
    if compare == "json":
        if value == reference:
            return "same"
        return "part" if _json_part(value, reference) else "wrong"
    return "same" if value == reference else "wrong"


def _counted(mine: Counter[Any], theirs: Counter[Any]) -> str:
    if any(count > theirs[key] for key, count in mine.items()):
        return "wrong"
    return "empty" if not mine and theirs else "part"


def _json_part(value: Any, reference: Any) -> bool:
    """Whether ``value`` holds part of ``reference``: lists a non-empty sub-multiset."""
    if isinstance(reference, dict):
        return (
            isinstance(value, dict)
            and value.keys() == reference.keys()
            and all(_json_part(value[key], reference[key]) for key in reference)
        )
    if isinstance(reference, list):
        if not isinstance(value, list) or (reference and not value):
            return False
        theirs = Counter(json.dumps(item, sort_keys=True) for item in reference)
        mine = Counter(json.dumps(item, sort_keys=True) for item in value)
        return all(count <= theirs[key] for key, count in mine.items())
    return bool(value == reference)


def _difference(reading: Reading, expected: Reading) -> str:
    """A short account of how an answer differs from the reference's."""
    value, reference = reading.value, expected.value
    if reading.compare == "rows":
        columns = reference.columns
        extra = value.on(columns) - reference.on(columns)
        missing = reference.on(columns) - value.on(columns)
        return (
            f"{len(value.rows)} rows where the run recorded {len(reference.rows)}: "
            f"{sum(extra.values())} not recorded, {sum(missing.values())} missing"
        )
    if reading.compare == "count":
        return f"{value} rows where the run recorded {reference}"
    if reading.compare == "lines":
        extra = [line for line in value if line and line not in reference][:2]
        missing = [line for line in reference if line and line not in value][:2]
        return f"output has {extra} where the run's has {missing}"
    if reading.compare == "counter":
        extra, missing = value - reference, reference - value
        return f"{sum(extra.values())} entries not recorded, {sum(missing.values())} missing"
    if isinstance(value, tuple) and isinstance(reference, tuple):  # a run's meta, as pairs
        value, reference = dict(value), dict(reference)
    return _where_differs(value, reference, "")


def _where_differs(value: Any, reference: Any, path: str) -> str:
    """The first place where an answer differs: ``runs[0].alerts: 0, where the run reads 1``."""
    if isinstance(value, dict) and isinstance(reference, dict):
        for key in sorted({*value, *reference}, key=str):
            if key not in value or key not in reference:
                return f"{path}{key}: only in {'the answer' if key in value else 'the run'}"
            if value[key] != reference[key]:
                return _where_differs(value[key], reference[key], f"{path}{key}.")
    if isinstance(value, list) and isinstance(reference, list) and len(value) == len(reference):
        for index, (mine, theirs) in enumerate(zip(value, reference, strict=True)):
            if mine != theirs:
                return _where_differs(mine, theirs, f"{path.rstrip('.')}[{index}].")
    mine, theirs = json.dumps(value, default=str), json.dumps(reference, default=str)
    return f"{path.rstrip('.') or 'answer'}: {mine:.80}, where the run reads {theirs:.80}"


def classify(
    case: corpus.Case,
    readings: Mapping[str, Reading],
    reference: Mapping[str, Reading] | None,
    readers: Sequence[str] = READERS,
) -> list[Outcome]:
    """The outcome of each of ``readers`` on the case's run."""
    return [
        judge(case, reader, readings[reader], None if reference is None else reference[reader])
        for reader in readers
    ]


class Classifier:
    """Builds each case's run under ``folder`` and classifies what every reader does with it.

    The reference runs are read once each and kept. A case that asks for it is read by an
    ``isolation.Worker``: bounded in memory, or as a user who is not root; ``close`` ends them.
    """

    def __init__(self, bases: corpus.Bases, folder: Path) -> None:
        self.bases = bases
        self.folder = folder
        self.params = discover_params(bases.single)
        self._references: dict[tuple[Any, ...], dict[str, Reading]] = {}
        self._workers: dict[int | None, isolation.Worker] = {}
        self._open: Path | None = None  # cases read as NOBODY: a folder any user may read

    def outcomes(self, case: corpus.Case, readers: Sequence[str] = READERS) -> list[Outcome]:
        """The outcome of each of ``readers`` on the case's run."""
        params = {**self.params, **case.params}
        as_nobody = case.unprivileged and isolation.is_root()
        place = self._open_folder() / case.name if as_nobody else self.folder / "cases" / case.name
        run = corpus.build(case, self.bases, place, isolation.open_to_all if as_nobody else None)
        try:
            readings = self._read(case, run, params, place, readers)
        finally:
            isolation.restore_rights(place)
        reference = self.reference(case, params)
        if case.folder != corpus.RUN_FOLDER:  # the run's folder renamed: names made alike
            readings = folder_names.alike(readings, case.folder)
            reference = reference and folder_names.alike(reference, case.folder)
        return classify(case, readings, reference, readers)

    def _read(
        self,
        case: corpus.Case,
        run: Path,
        params: Mapping[str, str],
        place: Path,
        readers: Sequence[str],
    ) -> dict[str, Reading]:
        user = isolation.NOBODY if case.unprivileged and isolation.is_root() else None
        if not case.isolated and user is None:
            return read_all(run, params, place, readers)
        if user not in self._workers:
            home = (self._open_folder() if user is not None else self.folder) / f"home-{user}"
            home.mkdir(exist_ok=True)
            home.chmod(0o777)
            warm_up = (self.bases.single, dict(self.params))
            self._workers[user] = isolation.Worker(user, home, warm_up)
        result = self._workers[user].read(run, dict(params), place, readers)
        if isinstance(result, str):  # the process gave nothing: every reader's outcome
            failed = Reading("hang" if result.startswith("hang") else "traceback", message=result)
            return dict.fromkeys(readers, failed)
        return result

    def _open_folder(self) -> Path:
        if self._open is None:
            self._open = Path(tempfile.mkdtemp(prefix="layerscope-damage-"))
            self._open.chmod(0o755)
        return self._open

    def close(self) -> None:
        """End the reading processes; remove the folder of the cases read as NOBODY."""
        for worker in self._workers.values():
            worker.close()
        self._workers.clear()
        if self._open is not None:
            isolation.restore_rights(self._open)
            shutil.rmtree(self._open, ignore_errors=True)
            self._open = None

    def reference(self, case: corpus.Case, params: Mapping[str, str]) -> dict[str, Reading] | None:
        if case.crafted:
            return None
        key = corpus.reference_key(case)
        if key not in self._references:
            place = self.folder / "references" / str(len(self._references))
            run = corpus.build_reference(case, self.bases, place)
            self._references[key] = read_all(run, params, place)
        return self._references[key]
