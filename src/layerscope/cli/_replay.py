"""The rows of a stored run, rebuilt as the records a scope hands its sinks, and sent.

``layerscope export`` uses this to replay a run into TensorBoard, W&B or MLflow through the
same sink classes that ``watch(sinks=...)`` writes to. It needs torch (the rows are tensors),
so the command imports it only when it runs.
"""

from __future__ import annotations

import argparse
import math
import numbers
import time
from collections.abc import Callable, Collection, Iterator
from typing import TYPE_CHECKING, Any

import torch

from layerscope.cli._open import CommandError
from layerscope.distributed import ProcessRank
from layerscope.health import Alert
from layerscope.model import (
    ATTENTION_COLUMNS,
    SENTINEL_STATS,
    AttentionRow,
    Form,
    Identities,
    Identity,
    Kind,
)
from layerscope.sinks import (
    ALERT_COLUMNS,
    DEFAULT_STATS,
    Records,
    RunInfo,
    RunSummary,
    Sink,
    StatsRows,
)

if TYPE_CHECKING:
    import pandas

    from layerscope.store import Run

#: About how many rows of statistics one chunk of steps holds.
CHUNK_ROWS = 50_000
_COUNT_STATS = frozenset(("numel", "nan_count", "inf_count"))


def send(recorded: Run, rank: int, sink: Sink, sent: Sent) -> None:
    """Start ``sink``, write the run's rows of ``rank`` to it, and close it.

    On a terminal a bar counts the ranges of steps sent.
    """
    from layerscope.cli._progress import progress

    sink.start(_run_info(recorded))
    # A run that failed or crashed replays as failed; a finished one, or one still being
    # written, as finished: its rows so far are all sent.
    status = "failed"
    try:
        ranges = step_ranges(recorded, rank)
        with progress("exporting steps", len(ranges)) as advance:
            for records in replay(recorded, rank, ranges, advance):
                sent.add(records)
                sink.write(records)
        sink.flush()
        status = "failed" if recorded.meta.get("status") in ("failed", "crashed") else "finished"
    finally:
        sink.close(_summary(recorded, status, sent))


class Sent:
    """What was sent so far: counts, and the first and last step."""

    def __init__(self) -> None:
        self.rows = self.scalars = self.alerts = 0
        self.first: int | None = None
        self.last: int | None = None

    def add(self, records: Records) -> None:
        """Count ``records``."""
        steps = [step for step, _, _ in records.scalars]
        if records.stats is not None and len(records.stats):
            self.rows += len(records.stats)
            steps += [int(records.stats.step.min()), int(records.stats.step.max())]
        self.scalars += len(records.scalars)
        self.alerts += len(records.alerts)
        if steps:
            self.first = min(steps) if self.first is None else min(self.first, *steps)
            self.last = max(steps) if self.last is None else max(self.last, *steps)

    def steps_text(self) -> str:
        """``steps 0 to 9``, or ``no steps``."""
        if self.first is None:
            return "no steps"
        return f"steps {self.first} to {self.last}"


def chosen_sink(args: argparse.Namespace) -> tuple[Sink, Any]:
    """The sink that ``args`` asks for, and how to say where it wrote."""
    from layerscope.sinks import MLflow, TensorBoard, WandB

    if args.project is not None and not args.wandb:
        raise CommandError("--project goes with --wandb")
    if (args.tracking_uri is not None or args.experiment is not None) and not args.mlflow:
        raise CommandError("--tracking-uri and --experiment go with --mlflow")
    stats = DEFAULT_STATS if args.stats is None else [n for n in args.stats.split(",") if n]
    if args.tensorboard is not None:
        where = f"TensorBoard {args.tensorboard}"
        return TensorBoard(args.tensorboard, stats=stats), lambda sink: where
    if args.wandb:
        return WandB(project=args.project, stats=stats), lambda sink: f"W&B run {sink.run_id}"
    mlflow_sink = MLflow(tracking_uri=args.tracking_uri, experiment=args.experiment, stats=stats)
    return mlflow_sink, lambda sink: f"MLflow run {sink.run_id}"


def _run_info(recorded: Run) -> RunInfo:
    meta = recorded.meta
    try:
        modules = recorded.modules
    except (OSError, ValueError):  # a run without its module tree still has its rows
        modules = []
    return RunInfo(
        id=str(meta.get("id", "")),
        name=str(meta.get("name", "")),
        started=float(meta.get("started") or time.time()),
        place=ProcessRank(),
        config=dict(meta.get("config") or {}),
        modules=modules,
        histogram_edges=meta.get("histogram_edges"),
    )


def _summary(recorded: Run, status: str, sent: Sent) -> RunSummary:
    meta = recorded.meta
    return RunSummary(
        status=status,
        ended=float(meta.get("ended") or time.time()),
        steps=int(meta.get("steps") or 0),
        recorded_rows=sent.rows,
        dropped_rows=int(meta.get("dropped_rows") or 0),
        failures=int(meta.get("failures") or 0),
    )


# ---------------------------------------------------------------- reading the run back


def replay(
    recorded: Run,
    rank: int = 0,
    ranges: list[tuple[int | None, int | None]] | None = None,
    range_done: Callable[[], None] | None = None,
) -> Iterator[Records]:
    """The rows of ``rank`` as ``Records``, one per range of steps of about ``CHUNK_ROWS``.

    Each range's statistics come first as training wrote them, then its sentinel rows
    (statistics of steps not fully recorded), its scalars, its alerts and its attention rows.
    ``ranges``: ``step_ranges(recorded, rank)`` where the caller has them already;
    ``range_done`` is called as each range has been given.
    """
    rank = int(rank)
    config = recorded.meta.get("config") or {}
    edges = recorded.meta.get("histogram_edges")
    identities = Identities()
    alerts = _alerts(recorded, rank)
    attention = _attention(recorded, rank)
    for low, high in step_ranges(recorded, rank) if ranges is None else ranges:
        where = "rank = $rank"
        where += "" if low is None else " and step > $low"
        where += "" if high is None else " and step <= $high"
        bounds = {"rank": rank, "low": low, "high": high}
        params = {name: value for name, value in bounds.items() if value is not None}
        frame = recorded.sql(f"select * from stats where {where} order by step", params)
        scalars = recorded.sql(
            f"select step, name, value from scalars where {where} order by step", params
        )
        records = Records(
            scalars=[
                (int(step), str(name), float(value))
                for step, name, value in scalars.itertuples(index=False)
            ],
            alerts=[alert for alert in alerts if _within(alert.step, low, high)],
            attention=[row for row in attention if _within(row.step, low, high)],
        )
        # An unknown sentinel flag (a file without the column) reads as a full row's.
        sentinels = frame["sentinel"].fillna(False).astype(bool)
        chunks = [
            _stats_rows(frame[sentinels == sentinel], rank, config, edges, identities)
            for sentinel in (False, True)
        ]
        chunks = [chunk for chunk in chunks if chunk is not None]
        records.stats = chunks[0] if chunks else None
        yield records
        for chunk in chunks[1:]:
            yield Records(stats=chunk)
        if range_done is not None:
            range_done()


def step_ranges(recorded: Run, rank: int) -> list[tuple[int | None, int | None]]:
    """Ranges ``(low, high]`` of steps holding about ``CHUNK_ROWS`` rows each, all steps in all.

    The first has no low end and the last no high end (None): scalars and alerts of steps
    without statistics are in one of them too.
    """
    counts = recorded.sql(
        "select step, count(*) as n from stats where rank = $rank group by step order by step",
        {"rank": int(rank)},
    )
    bounds: list[int] = []
    rows = 0
    for step, count in counts.itertuples(index=False):
        rows += int(count)
        if rows >= CHUNK_ROWS:
            bounds.append(int(step))
            rows = 0
    lows: list[int | None] = [None, *bounds]
    highs: list[int | None] = [*bounds, None]
    return list(zip(lows, highs, strict=True))


def _within(step: int, low: int | None, high: int | None) -> bool:
    return (low is None or step > low) and (high is None or step <= high)


def _alerts(recorded: Run, rank: int) -> list[Alert]:
    """The rank's alerts, read at once (they are few); fields an older run lacks get defaults."""
    frame = recorded.alerts
    if frame.empty:
        return []
    frame = frame[frame["rank"] == rank]
    defaults: dict[str, Any] = {"phase": "train", "tensor": "", "value": math.nan}
    defaults["threshold"] = math.nan
    alerts = []
    for record in frame.to_dict("records"):
        fields = {name: record.get(name) for name in ALERT_COLUMNS}
        for name in ALERT_COLUMNS:  # None where a file lacks the column: its default
            if fields[name] is None:
                fields[name] = defaults.get(name)
        for name in ("value", "threshold"):
            fields[name] = float(fields[name]) if fields[name] is not None else math.nan
        fields["step"] = int(fields["step"])
        if fields["severity"] not in ("info", "warning", "error"):
            fields["severity"] = "warning"
        alerts.append(Alert(**fields))
    return alerts


def _attention(recorded: Run, rank: int) -> list[AttentionRow]:
    """The rank's attention rows, read at once (a few per head and recorded step)."""
    frame = recorded.attention
    frame = frame[frame["rank"] == rank]
    return [
        AttentionRow(*(record[name] for name in ATTENTION_COLUMNS))
        for record in frame.to_dict("records")
    ]


def _stats_rows(
    frame: pandas.DataFrame,
    rank: int,
    config: dict[str, Any],
    edges: list[float] | None,
    identities: Identities,
) -> StatsRows | None:
    """The rows of ``frame``, all sentinel rows or none, as the writer hands them to sinks."""
    if frame.empty:
        return None
    sentinel = bool(frame["sentinel"].fillna(False).iloc[0])
    builtin = [name for name in config.get("stats", ()) if name != "hist"]
    names = [name for name in builtin if not sentinel or name in SENTINEL_STATS]
    if "numel" not in names:
        names.insert(0, "numel")
    stats = {name: _column(frame[name], name) for name in names if name in frame}
    custom = {
        name: [_plain(value) for value in frame[name]]
        for name in config.get("custom_stats", ())
        if name in frame and not sentinel
    }
    identity = [
        identities.code(Identity(phase, module, _text(module_type), Kind(kind), tensor, int(call)))
        for phase, module, module_type, kind, tensor, call in zip(
            frame["phase"],
            frame["module"],
            frame["module_type"],
            frame["kind"],
            frame["tensor"],
            frame["call"],
            strict=True,
        )
    ]
    form = [
        identities.form_code(Form(_text(dtype), _shape(shape), _shard(shard)))
        for dtype, shape, shard in zip(frame["dtype"], frame["shape"], frame["shard"], strict=True)
    ]
    hist = None
    if not sentinel and edges and "hist" in frame:
        hist = _histograms(frame["hist_lo"], frame["hist"], len(edges))
    return StatsRows(
        step=torch.tensor(frame["step"].to_numpy(dtype="int64")),
        identity=torch.tensor(identity, dtype=torch.int64),
        form=torch.tensor(form, dtype=torch.int64),
        identities=identities,
        rank=rank,
        stats=stats,
        custom=custom,
        hist=hist,
        sentinel=sentinel,
    )


def _column(column: pandas.Series, name: str) -> torch.Tensor:
    """A statistic's column as the writer has it: int64 counts, float64 otherwise."""
    values = column.to_numpy(dtype="float64", na_value=math.nan)
    if name in _COUNT_STATS and not torch.isnan(torch.from_numpy(values)).any():
        return torch.from_numpy(values).to(torch.int64)
    return torch.from_numpy(values.copy())


def _histograms(lows: pandas.Series, trimmed: pandas.Series, slots: int) -> torch.Tensor:
    """Stored histograms (counts from slot ``hist_lo`` on) widened to ``(rows, slots)``."""
    full = torch.zeros(len(trimmed), slots, dtype=torch.float64)
    for row, (low, counts) in enumerate(zip(lows, trimmed, strict=True)):
        if not (_stored(low) and _stored(counts)):  # a sentinel row's, or a file's without
            continue
        values = torch.as_tensor(list(counts), dtype=torch.float64)
        full[row, int(low) : int(low) + len(values)] = values
    return full


def _shape(shape: Any) -> tuple[int, ...]:
    return tuple(int(size) for size in shape) if _stored(shape) else ()


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""  # pandas' NA: a file without the column


def _stored(value: Any) -> bool:
    """Whether a cell holds a value: not None, NaN or pandas' NA (a file without the column)."""
    if isinstance(value, float):
        return not math.isnan(value)
    return isinstance(value, numbers.Number | Collection)


def _shard(shard: Any) -> str | None:
    return shard if isinstance(shard, str) else None


def _plain(value: Any) -> Any:
    """A custom statistic's value: a number, or a list of numbers for one of several."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return value
