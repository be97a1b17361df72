"""``layerscope diff RUN_A RUN_B``: two runs of one model compared layer by layer."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from layerscope.cli import _format, _queries
from layerscope.cli._arguments import PHASES, count
from layerscope.cli._compare import Comparison, Difference, compare
from layerscope.cli._console import Column, Table, open_output
from layerscope.cli._layers import in_model_order, module_types, shown_name
from layerscope.cli._open import CommandError, open_run
from layerscope.cli._storage_options import storage_options

if TYPE_CHECKING:
    from layerscope.cli._command import Subparsers
    from layerscope.store import Run

_NAMES_LISTED = 8  # of the modules only one run has, in a warning


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add ``diff``'s parser."""
    parser = subparsers.add_parser(
        "diff",
        help="compare two runs of one model, layer by layer",
        description=(
            "Compare the statistics of two runs of the same model at one step, matched by "
            "module, kind and tensor: A, B and (B - A) / |A|, the layers that differ most "
            "first. The step is the latest both runs recorded, else each run's latest."
        ),
    )
    parser.add_argument("run_a", metavar="RUN_A", help="the first run's directory")
    parser.add_argument("run_b", metavar="RUN_B", help="the second run's directory")
    parser.add_argument("--phase", default="train", choices=PHASES, help="train (default) or eval")
    parser.add_argument("--step", type=int, help="compare this step, which both runs recorded")
    parser.add_argument(
        "--rank", type=int, help="compare this rank of both runs (default: each run's lowest)"
    )
    parser.add_argument(
        "--kind", action="append", choices=_queries.KIND_NAMES, help="only this kind (repeatable)"
    )
    parser.add_argument(
        "--top", type=count, default=30, metavar="N", help="show the N first rows (0: all)"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Print the comparison of ``args.run_a`` and ``args.run_b``."""
    options = storage_options(args)
    run_a, run_b = open_run(args.run_a, options), open_run(args.run_b, options)
    rank_a = _queries.checked_rank(run_a, args.rank, run_a.path)
    rank_b = _queries.checked_rank(run_b, args.rank, run_b.path)
    step_a, step_b = _steps_compared(run_a, run_b, args.phase, (rank_a, rank_b), args.step)
    rows_a = _queries.rows_at_step(run_a, step_a, args.phase, rank_a)
    rows_b = _queries.rows_at_step(run_b, step_b, args.phase, rank_b)
    if args.kind:
        rows_a = rows_a[rows_a.kind.isin(args.kind)]
        rows_b = rows_b[rows_b.kind.isin(args.kind)]
    recorded = _queries.recorded(_queries.stats_columns(run_a)) & _queries.recorded(
        _queries.stats_columns(run_b)
    )
    types_a, types_b = module_types(run_a), module_types(run_b)
    # A module of one name but another type (another architecture) is not the same layer.
    retyped = sorted(
        name for name in types_a.keys() & types_b.keys() if types_a[name] != types_b[name]
    )
    rows_a, rows_b = rows_a[~rows_a.module.isin(retyped)], rows_b[~rows_b.module.isin(retyped)]
    order = in_model_order(set(rows_a.module) | set(rows_b.module), types_a or types_b)
    comparison = compare(rows_a, rows_b, recorded, order)

    output = open_output(args.plain)
    steps = f"step {step_a}" if step_a == step_b else f"step {step_a} of A, {step_b} of B"
    ranks = _ranks_compared(run_a, run_b, rank_a, rank_b)
    output.fields(
        "diff",
        [
            ("A", _describe(run_a)),
            ("B", _describe(run_b)),
            ("compared", f"{steps}, phase {args.phase}, {ranks}"),
        ],
    )
    for warning in _warnings(comparison, retyped, types_a, types_b):
        output.line(f"warning: {warning}", style="yellow")
    if not comparison.differences:
        output.line("nothing to compare: no tensor is in both runs")
        return 0
    limit = args.top if args.top > 0 else None
    output.table(differences_table(comparison.differences[:limit]))
    left = len(comparison.differences) - len(comparison.differences[:limit])
    if left:
        output.line(f"... {left} more rows; --top 0 shows them all")
    return 0


def differences_table(differences: list[Difference]) -> Table:
    """A row per compared statistic: module, kind, tensor, statistic, A, B, relative."""
    table = Table(
        "layers, most different first",
        [
            Column("module"),
            Column("kind"),
            Column("tensor"),
            Column("stat"),
            Column("A", numeric=True),
            Column("B", numeric=True),
            Column("(B-A)/|A|", numeric=True),
        ],
    )
    for difference in differences:
        tensor = difference.tensor + (f"#{difference.call}" if difference.call else "")
        table.add(
            [
                shown_name(difference.module),
                difference.kind,
                tensor,
                difference.stat,
                _format.number(difference.a),
                _format.number(difference.b),
                _format.relative(difference.relative),
            ]
        )
    return table


def _steps_compared(
    run_a: Run, run_b: Run, phase: str, ranks: tuple[int, int], step: int | None
) -> tuple[int, int]:
    """The step of each run to compare: ``step``, else the latest both have, else each's."""
    steps_a = _queries.steps_of(run_a, phase, ranks[0])
    steps_b = _queries.steps_of(run_b, phase, ranks[1])
    for path, steps in ((run_a.path, steps_a), (run_b.path, steps_b)):
        if not steps:
            raise CommandError(f"{path} has no statistics of phase {phase} (yet)")
        if step is not None and step not in steps:
            raise CommandError(
                f"{path} did not record step {step} (phase {phase}); it recorded steps "
                f"{steps[0]} to {steps[-1]}"
            )
    if step is not None:
        return step, step
    common = set(steps_a) & set(steps_b)
    if common:
        return max(common), max(common)
    return steps_a[-1], steps_b[-1]


def _ranks_compared(run_a: Run, run_b: Run, rank_a: int, rank_b: int) -> str:
    """Which rank of each run is compared; of a job of several ranks, how many it has."""
    wrote_a, wrote_b = len(run_a.meta.get("ranks") or ()), len(run_b.meta.get("ranks") or ())
    each = [
        f"rank {rank} of {label}" + (f" ({wrote} ranks)" if wrote > 1 else "")
        for label, rank, wrote in (("A", rank_a, wrote_a), ("B", rank_b, wrote_b))
    ]
    hint = ": --rank N compares another" if max(wrote_a, wrote_b) > 1 else ""
    return ", ".join(each) + hint


def _describe(run: Run) -> str:
    meta = run.meta
    return f"{meta.get('name')} ({meta.get('status')}, {meta.get('steps')} steps) {run.path}"


def _warnings(
    comparison: Comparison, retyped: list[str], types_a: dict[str, str], types_b: dict[str, str]
) -> list[str]:
    """Modules of other types in the two runs (not compared), and what only one run has."""
    warnings = []
    if retyped:
        each = "; ".join(
            f"{shown_name(name)}: {types_a[name]} in A, {types_b[name]} in B"
            for name in retyped[:_NAMES_LISTED]
        )
        more = f"; and {len(retyped) - _NAMES_LISTED} more" if len(retyped) > _NAMES_LISTED else ""
        warnings.append(f"not compared, of another type in each run: {each}{more}")
    for label, keys in (("A", comparison.only_a), ("B", comparison.only_b)):
        whole = sorted({module for module, *_ in keys} - set(comparison_modules(comparison)))
        if whole:
            warnings.append(f"{_listed(whole)} only in {label}")
        partial = [key for key in keys if key[0] not in whole]
        if partial:
            shown = ", ".join(
                f"{shown_name(module)} {kind} {tensor}"
                for module, kind, tensor, _ in partial[:_NAMES_LISTED]
            )
            hidden = len(partial) - _NAMES_LISTED
            tail = f" and {hidden} more" if hidden > 0 else ""
            warnings.append(f"tensors only in {label}: {shown}{tail}")
    return warnings


def comparison_modules(comparison: Comparison) -> set[str]:
    """The modules of which some tensor is compared."""
    return {difference.module for difference in comparison.differences}


def _listed(modules: list[str]) -> str:
    """Up to a few module names, and how many more."""
    names = ", ".join(shown_name(module) for module in modules[:_NAMES_LISTED])
    more = len(modules) - _NAMES_LISTED
    noun = "module" if len(modules) == 1 else "modules"
    return f"{noun} {names}" + (f" and {more} more" if more > 0 else "")
