"""What every reader does with damaged and crafted runs: an outcome per case and reader family.

    python benchmarks/damage.py                     # prints the table (markdown)
    python benchmarks/damage.py --write FILE        # also saves it in FILE
    python benchmarks/damage.py --case stats-       # only the cases whose name holds this
    PYTHONPATH=OTHER/src python benchmarks/damage.py   # the layerscope of another checkout

The corpus is ``tests/damage/corpus.py`` (about a hundred damaged copies of a small real run,
written by the layerscope imported), ``hostile_cases.py`` (named pipes, devices, damaged pages,
unreadable files, pattern folder names, terminal escapes) and ``schema_cases.py`` (a wrong value
for every field at every depth of run.json and modules.json, generated from their schema, and
the extremes of every number); the rules are ``tests/damage/classify.py``. The table counts
reader outcomes: seven library readers, two commands and nine dashboard routes per case; the
list after it gives every bad one with its message or the last line of its traceback. The
generated cases' rows are summed up by field (``--each`` shows them one by one).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "tests" / "damage"))

import classify
import corpus
import hostile_cases
import schema_cases

CASES = (*corpus.CASES, *hostile_cases.CASES, *schema_cases.CASES)

# Worst first: a cell lists a family's outcomes in this order.
SEVERITY = tuple(reversed(classify.OUTCOMES))
_FAMILY_OF = {reader: family for family, readers in classify.FAMILIES.items() for reader in readers}


def cell(outcomes: list[classify.Outcome]) -> str:
    """A family's outcomes in one cell: ``ok``, or ``traceback (summary); named (6 readers)``."""
    counts = Counter(outcome.outcome for outcome in outcomes)
    if len(counts) == 1:
        return str(next(iter(counts)))
    parts = []
    for word in sorted(counts, key=SEVERITY.index):
        readers = [o.reader.removeprefix("ui:") for o in outcomes if o.outcome == word]
        named = f"{len(readers)} readers" if len(readers) > 3 else ", ".join(readers)
        parts.append(f"{word} ({named})")
    return "; ".join(parts)


def grouped(
    results: dict[str, list[classify.Outcome]], each: bool
) -> dict[str, list[classify.Outcome]]:
    """The results by row of the table: a generated field's cases in one row, unless ``each``."""
    if each:
        return results
    rows: dict[str, list[classify.Outcome]] = {}
    counted: Counter[str] = Counter()
    for name, outcomes in results.items():
        row = schema_cases.GROUP_OF.get(name, name)
        rows.setdefault(row, []).extend(outcomes)
        counted[row] += 1
    return {
        (row if row in results else f"{row} ({counted[row]} values)"): outcomes
        for row, outcomes in rows.items()
    }


def table(
    results: dict[str, list[classify.Outcome]], where: str, seconds: float, each: bool = False
) -> str:
    families = list(classify.FAMILIES)
    lines = [
        "# Damaged runs: what every reader does",
        "",
        f"layerscope from `{where}`; {len(results)} cases, "
        f"{len(classify.READERS)} readers each, {seconds:.0f} s.",
        "",
        "| case | " + " | ".join(families) + " |",
        "|---|" + "---|" * len(families),
    ]
    for name, outcomes in grouped(results, each).items():
        cells = [cell([o for o in outcomes if _FAMILY_OF[o.reader] == f]) for f in families]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    totals = {family: Counter[str]() for family in families}
    for outcomes in results.values():
        for outcome in outcomes:
            totals[_FAMILY_OF[outcome.reader]][outcome.outcome] += 1
    lines += [
        "",
        "## Totals (reader outcomes)",
        "",
        "| outcome | " + " | ".join(families) + " | all |",
        "|---|" + "---:|" * (len(families) + 1),
    ]
    for word in classify.OUTCOMES:
        counts = [totals[family][word] for family in families]
        bad = " (bad)" if word in classify.BAD else ""
        lines.append(f"| {word}{bad} | " + " | ".join(map(str, counts)) + f" | {sum(counts)} |")
    flawed = [name for name, outcomes in results.items() if _bad(outcomes)]
    lines += ["", f"Cases with a bad outcome: {len(flawed)} of {len(results)}.", ""]
    if flawed:
        lines += ["## Bad outcomes", ""]
        for name in flawed:
            for outcome in _bad(outcomes=results[name]):
                detail = outcome.detail.replace("|", "\\|").replace("\n", " ")
                lines.append(f"- {name} / {outcome.reader}: **{outcome.outcome}**: {detail}")
        lines.append("")
    return "\n".join(lines)


def _bad(outcomes: list[classify.Outcome]) -> list[classify.Outcome]:
    return [outcome for outcome in outcomes if outcome.outcome in classify.BAD]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", metavar="FILE", help="also save the table in FILE")
    parser.add_argument("--case", default="", help="only the cases whose name holds this")
    parser.add_argument("--each", action="store_true", help="a row for each generated case")
    args = parser.parse_args()
    import layerscope

    start = time.perf_counter()
    results = {}
    with tempfile.TemporaryDirectory(prefix="layerscope-damage-") as folder:
        classifier = classify.Classifier(corpus.make_bases(Path(folder) / "bases"), Path(folder))
        try:
            for case in CASES:
                if args.case in case.name:
                    results[case.name] = classifier.outcomes(case)
                    print(f"{case.name}: {cell(results[case.name])}", file=sys.stderr)
        finally:
            classifier.close()
    where = str(Path(layerscope.__file__).parent)
    text = table(results, where, time.perf_counter() - start, args.each)
    print(text)
    if args.write:
        Path(args.write).write_text(text)


if __name__ == "__main__":
    main()
