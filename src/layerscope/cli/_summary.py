"""``layerscope summary RUN``: what the run is and cost, each layer's statistics, its alerts."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from layerscope.cli import _format, _queries
from layerscope.cli._alerts import alerts_table, count_line, severity_counts
from layerscope.cli._arguments import PHASES, RUN_METAVAR, count
from layerscope.cli._attention import attention_table
from layerscope.cli._console import Output, open_output
from layerscope.cli._headroom import headroom_fields
from layerscope.cli._layer_table import OVERVIEW, layers_table, measures_of
from layerscope.cli._layers import module_types
from layerscope.cli._open import open_run
from layerscope.cli._rank_spread import rank_spread, spread_table
from layerscope.cli._root_cause import root_cause_fields
from layerscope.cli._storage_options import storage_options
from layerscope.model import quote_identifier

if TYPE_CHECKING:
    from layerscope.cli._command import Subparsers
    from layerscope.store import Run

_SCALARS_SHOWN = 10  # a run logging hundreds of scalars still gets a short summary


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add ``summary``'s parser."""
    parser = subparsers.add_parser(
        "summary",
        help="a run's metadata, cost, per-layer statistics and alerts",
        description=(
            "Show a run (finished, running or crashed): its metadata and layerscope's cost, "
            "each layer in model order with its latest statistics and their trend since the "
            "first recorded step, the attention heads of lowest entropy (where recorded), "
            "and its alerts."
        ),
    )
    parser.add_argument("run", metavar=RUN_METAVAR, help="the run's directory (or fsspec URL)")
    parser.add_argument("--phase", default="train", choices=PHASES, help="train (default) or eval")
    parser.add_argument(
        "--kind",
        action="append",
        choices=_queries.KIND_NAMES,
        help="show mean, std, absmax, l2 and zero fraction of this kind (repeatable)",
    )
    parser.add_argument("--rank", type=int, help="the rank to show (default: the lowest)")
    parser.add_argument(
        "--alerts", type=count, default=20, metavar="N", help="show the first N alerts (0: all)"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Print the summary of ``args.run``."""
    opened = open_run(args.run, storage_options(args))
    args.rank = _queries.checked_rank(opened, args.rank)
    output = open_output(args.plain)
    output.fields("run", run_fields(opened) + reach_fields(opened, args.rank))
    output.fields("cost", cost_fields(opened.meta))
    scalars = scalar_fields(opened, args.rank)
    if scalars:
        output.fields("logged scalars: latest (first)", scalars)
    show_layers(output, opened, args)
    show_spread(output, opened, args.phase)
    headroom = headroom_fields(opened, args.phase, args.rank)
    if headroom is not None:
        output.fields(*headroom)
    heads = attention_table(opened, args.phase, args.rank)
    if heads is not None:
        output.table(heads)
    counts = severity_counts(opened)
    cause = root_cause_fields(opened)
    if cause is not None:
        output.fields("likely root cause", cause)
    output.line(count_line(counts))
    if counts:
        limit = args.alerts if args.alerts > 0 else None
        output.table(alerts_table(opened, limit))
        if limit is not None and limit < sum(counts.values()):
            output.line(f"... the first {limit} shown; --alerts 0 shows them all")
    if opened.skipped:
        output.fields("files left out (damaged)", list(opened.skipped.items()))
    return 0


def run_fields(run: Run) -> list[tuple[str, str]]:
    """Name, status, steps, ranks, times, host, versions, kernel and kinds of a run."""
    meta = run.meta
    versions = meta.get("versions") or {}
    fields = [
        ("name", _format.text(meta.get("name"))),
        ("path", run.path),
        ("status", _status(meta)),
        ("steps", _format.number(meta.get("steps"))),
        ("ranks", _ranks(meta)),
        ("started", _format.timestamp(meta.get("started"))),
        ("ended", _ended(meta)),
    ]
    if meta.get("status") in ("running", "crashed"):
        fields.append(("updated", _ago(meta.get("updated"))))
    fields += [
        (
            "host",
            f"{meta.get('host', '-')} (user {meta.get('user') or '-'}, pid {meta.get('pid')})",
        ),
        ("versions", ", ".join(f"{name} {version}" for name, version in versions.items())),
        ("kernel", _format.text(meta.get("kernel"))),
        ("kinds", ", ".join(recorded_kinds(meta.get("config") or {})) or "-"),
    ]
    return fields


def recorded_kinds(config: dict[str, Any]) -> list[str]:
    """The kinds a run's configuration names, as ``kinds`` or by its old name ``capture``.

    A run written before ``watch()``'s argument was renamed holds ``capture``.
    """
    return list(config.get("kinds", config.get("capture", ())))


def reach_fields(run: Run, rank: int | None = None) -> list[tuple[str, str]]:
    """The last step each table holds, where a run that did not finish may have left them apart.

    Of ``rank``'s rows (None: the lowest rank's).

    A writer killed between two files of one flush leaves, say, statistics to step 309 and
    scalars to step 298: the reader shows what each holds rather than guess.
    """
    if run.meta.get("status") not in ("running", "crashed", "failed"):
        return []
    import pandas

    rank = _queries.lowest_rank(run) if rank is None else rank
    reached = []
    for table in ("stats", "scalars", "alerts"):
        query = f"select max(step) as last from {quote_identifier(table)} where rank = $rank"
        frame = run.sql(query, {"rank": rank})
        last = frame["last"].iloc[0]
        reached.append(f"{table} none" if pandas.isna(last) else f"{table} to step {int(last)}")
    return [("tables", ", ".join(reached))]


def cost_fields(meta: dict[str, Any]) -> list[tuple[str, str]]:
    """What layerscope cost the training: time, dropped rows and scalars, failures."""
    ranks = [entry for entry in meta.get("ranks") or () if isinstance(entry, dict)]
    if len(ranks) > 1:
        return _job_cost_fields(ranks)

    def count(name: str) -> str:
        return _format.number(meta.get(name))

    return [
        ("training thread", f"{_seconds(meta.get('cost_seconds'))} in hooks and flushes"),
        ("writer thread", f"{_seconds(meta.get('writer_seconds'))} of CPU"),
        (
            "stats rows",
            f"{count('recorded_rows')} recorded, {count('written_rows')} written, "
            f"{count('dropped_rows')} dropped",
        ),
        ("scalars", f"{count('written_scalars')} written, {count('dropped_scalars')} dropped"),
        ("failures", count("failures")),
    ]


def _job_cost_fields(ranks: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The cost of a job of several ranks: counts summed, times of the slowest rank."""

    def total(name: str) -> str:
        values = [entry.get(name) for entry in ranks]
        numbers = [value for value in values if isinstance(value, int | float)]
        return _format.number(sum(numbers)) if numbers else _format.MISSING

    def slowest(name: str) -> str:
        timed = [(e[name], e["rank"]) for e in ranks if isinstance(e.get(name), int | float)]
        if not timed:
            return _format.MISSING
        seconds, rank = max(timed)
        return f"{_seconds(seconds)} on rank {rank}, the most of {len(ranks)} ranks"

    return [
        ("training thread", f"{slowest('cost_seconds')} (hooks and flushes)"),
        ("writer thread", f"{slowest('writer_seconds')} (CPU)"),
        (
            "stats rows",
            f"{total('recorded_rows')} recorded, {total('written_rows')} written, "
            f"{total('dropped_rows')} dropped, over {len(ranks)} ranks",
        ),
        ("scalars", f"{total('written_scalars')} written, {total('dropped_scalars')} dropped"),
        ("failures", total("failures")),
    ]


def scalar_fields(run: Run, rank: int | None = None) -> list[tuple[str, str]]:
    """Each scalar's latest value and step, and its first value, of ``rank`` (None: lowest)."""
    frame = run.sql(
        "select name, min(step) as first_step, max(step) as last_step, "
        "arg_min(value, step) as earliest, arg_max(value, step) as latest from scalars "
        "where rank = $rank group by name order by name limit $limit",
        {"rank": _queries.lowest_rank(run) if rank is None else rank, "limit": _SCALARS_SHOWN},
    )
    return [
        (
            _format.text(record.name),
            f"{_format.number(record.latest)} at step {_format.number(record.last_step)} "
            f"({_format.number(record.earliest)} at step {_format.number(record.first_step)})",
        )
        for record in frame.itertuples(index=False)
    ]


def show_layers(output: Output, run: Run, args: argparse.Namespace) -> None:
    """The layers table of ``args.phase`` and ``args.rank``, or a line saying there is none."""
    rank = _queries.lowest_rank(run) if args.rank is None else args.rank
    trends = _queries.layer_trends(run, args.phase, rank)
    wrote = len(run.meta.get("ranks") or ())
    where = f"phase {args.phase}, rank {rank}"
    if wrote > 1:
        where += f" of {wrote}: --rank N shows another"
    if trends.empty:
        output.line(f"no statistics recorded for {where}")
        return
    first, last = int(trends.first_step.min()), int(trends.last_step.max())
    steps = f"step {last}" if first == last else f"steps {first} to {last}"
    title = f"layers ({where}, {steps}): latest value, x latest / first"
    recorded = _queries.recorded(_queries.stats_columns(run))
    measures = measures_of(args.kind) if args.kind else OVERVIEW
    for kind in sorted(set(args.kind or ()) - set(trends.kind)):
        output.line(f"no {kind} rows for {where}: see the run's kinds")
    table = layers_table(trends, module_types(run), measures, recorded, title)
    if table.rows:
        output.table(table)


def show_spread(output: Output, run: Run, phase: str) -> None:
    """Where the run has several ranks: the modules whose ranks differ most."""
    wrote = len(run.meta.get("ranks") or ())
    if wrote < 2:
        return
    columns = _queries.stats_columns(run)
    if "l2" not in columns:
        return
    table = spread_table(rank_spread(run, phase, columns), wrote)
    if table is not None:
        output.table(table)


def _status(meta: dict[str, Any]) -> str:
    """The run's status; each rank's too where ranks differ."""
    ranks = meta.get("ranks") or []
    if len({entry["status"] for entry in ranks}) < 2:
        return str(meta.get("status"))
    each = ", ".join(f"rank {entry['rank']} {entry['status']}" for entry in ranks)
    return f"{meta.get('status')} ({each})"


def _ranks(meta: dict[str, Any]) -> str:
    wrote = len(meta.get("ranks") or [])
    world = meta.get("world_size")
    return f"{wrote} of world size {world}" if world else str(wrote)


def _ended(meta: dict[str, Any]) -> str:
    started, ended = meta.get("started"), meta.get("ended")
    if not isinstance(ended, int | float):
        return _format.MISSING
    if not isinstance(started, int | float):
        return _format.timestamp(ended)
    return f"{_format.timestamp(ended)} (after {_format.duration(ended - started)})"


def _ago(updated: object) -> str:
    """When the writer last renewed ``run.json``: a heartbeat long ago means a dead run."""
    if not isinstance(updated, int | float):
        return _format.MISSING
    age = max(0.0, time.time() - updated)
    return f"{_format.timestamp(updated)} ({_format.duration(age)} ago)"


def _seconds(value: object) -> str:
    return f"{_format.number(value)} s" if isinstance(value, int | float) else _format.MISSING
