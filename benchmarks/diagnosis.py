"""Diagnosis of planted training bugs: do the health alerts name the problem, layer and step?

    python benchmarks/diagnosis.py                 # every case; prints the table
    python benchmarks/diagnosis.py --write         # also updates BENCHMARKS.md and the alerts page
    python benchmarks/diagnosis.py --case gpt-     # the cases whose name holds "gpt-"
    python benchmarks/diagnosis.py --small         # a few cheap cases

Each case of the zoo (``diagnosis_zoo``: MLPs, a CNN with BatchNorm, a ResNet, a character
GPT, GRU and LSTM models, an autoencoder and a VAE, on scikit-learn's digits or a text made
in code) plants one bug at a known layer and step, and has a healthy twin: the same training
without the bug. Each trains from a fixed seed, watched as the README recommends,
``layerscope.watch(model, optimizer=opt, run=None)`` with the default schedule, and again
with ``every=10``. The verdict on a buggy run: "right" where its first alert of the expected
rule family names the case's layer within one recorded step of when the bug shows in what
was recorded; else "wrong rule", "wrong layer", "late" or "missed" (``diagnosis_zoo.scoring``
says it exactly). A warning or error on a twin is a false alarm.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import layerscope
import report  # run as a script
from diagnosis_zoo import (
    CASES,
    FAMILIES,
    SCHEDULES,
    VERDICTS,
    Case,
    Outcome,
    Verdict,
    alarms,
    judge,
    train,
)

TITLE = "Diagnosis of planted training bugs"


def run_case(case: Case) -> dict[str, tuple[Outcome, Outcome, Verdict]]:
    """The buggy run, the twin and the verdict of ``case`` under each schedule."""
    results = {}
    for schedule, every in SCHEDULES.items():
        buggy = train(case, True, every)
        twin = train(case, False, every)
        results[schedule] = (buggy, twin, judge(case, buggy.said, buggy.recorded))
    return results


def _planted(case: Case) -> str:
    shown = [] if case.visible is None else [f"stats {case.visible}"]
    if case.scalar_visible is not None:
        shown.append(f"loss {case.scalar_visible}")
    return f"{case.layer} @{case.planted} (seen: {', '.join(shown)})"


def _family(case: Case) -> str:
    named = [
        family if family in layerscope.health.RULES else f"{family} (no rule yet)"
        for family in (case.family, *case.also)
    ]
    return " or ".join(named)


def table(results: dict[str, dict[str, tuple[Outcome, Outcome, Verdict]]]) -> str:
    """The markdown table of every case run, then the totals."""
    by_name = {case.name: case for case in CASES}
    head = "| case | model | family | planted (layer @step; seen from) |"
    rule = "|---|---|---|---|"
    for schedule in SCHEDULES:
        head += f" said ({schedule}) | verdict ({schedule}) |"
        rule += "---|---|"
    lines = [head + " twin's false alarms |", rule + "---|"]
    for name, outcomes in results.items():
        case = by_name[name]
        row = f"| {name} | {case.model} | {_family(case)} | {_planted(case)} |"
        false = []
        for schedule, (_, twin, verdict) in outcomes.items():
            said = "nothing" if verdict.said is None else str(verdict.said)
            row += f" {said} | {verdict.verdict} |"
            false += [f"{alert} ({schedule})" for alert in alarms(twin.said)]
        lines.append(row + f" {'; '.join(false[:3]) or 'none'} |")
    return "\n".join(lines) + "\n\n" + totals(results)


def totals(results: dict[str, dict[str, tuple[Outcome, Outcome, Verdict]]]) -> str:
    """Right out of N and each other verdict's count by schedule; false alarms by twin."""
    count = len(results)
    lines = []
    for schedule in SCHEDULES:
        verdicts = Counter(outcomes[schedule][2].verdict for outcomes in results.values())
        twins = [alarms(outcomes[schedule][1].said) for outcomes in results.values()]
        others = ", ".join(f"{verdicts[v]} {v}" for v in VERDICTS[1:] if verdicts[v])
        lines.append(
            f"- {schedule}: **{verdicts['right']} right out of {count}** ({others or 'no other'}"
            f"); false alarms on **{sum(1 for found in twins if found)} of {count} twins** "
            f"({sum(len(found) for found in twins)} alerts)."
        )
    by_name = {case.name: case for case in CASES}
    unruled = sorted({by_name[n].family for n in results} - set(layerscope.health.RULES))
    expecting = sum(1 for n in results if by_name[n].family not in layerscope.health.RULES)
    if unruled:
        named = "; ".join(f"{family} ({FAMILIES[family]})" for family in unruled)
        lines.append(f"- {expecting} of {count} cases expect a family no rule has yet: {named}.")
    return "\n".join(lines)


def as_json(results: dict[str, dict[str, tuple[Outcome, Outcome, Verdict]]]) -> dict[str, object]:
    """Every alert of every run, for working on the rules against the zoo."""
    return {
        name: {
            schedule: {
                "verdict": verdict.verdict,
                "window": verdict.window,
                "buggy": [str(alert) + f" {alert.severity}" for alert in buggy.said],
                "twin": [str(alert) + f" {alert.severity}" for alert in twin.said],
                "recorded": list(buggy.recorded),
            }
            for schedule, (buggy, twin, verdict) in outcomes.items()
        }
        for name, outcomes in results.items()
    }


def chosen(pattern: str | None, small: bool) -> list[Case]:
    """The cases whose name holds ``pattern`` (all where None), only the small ones if asked."""
    cases = [case for case in CASES if pattern is None or pattern in case.name]
    if small:
        cases = [case for case in cases if case.small]
    if not cases:
        raise SystemExit(f"--case: no case name holds {pattern!r}; the cases: "
                         f"{', '.join(case.name for case in CASES)}")  # fmt: skip
    return cases


DOCS = Path(__file__).parent.parent / "docs" / "concepts" / "alerts.md"
DOCS_TITLE = "How well they diagnose planted bugs"


def write_docs(text: str) -> None:
    """Put the table in its section of the alerts page, before the page's closing links."""
    page = DOCS.read_text()
    section = (
        f"## {DOCS_TITLE}\n\n`python benchmarks/diagnosis.py` trains {len(CASES)} planted bugs, "
        "each at a known layer and step of a small model and each with a healthy twin, "
        "watched with the default schedule and with `every=10`; BENCHMARKS.md says how they "
        "are scored and on what machine. *Said* is the first alert of the expected rule "
        "family (else the first alert); *right*, that family, the case's layer, at most one "
        "recorded step late. The layer is judged by what was recorded: an alert made from the "
        "loss or GradScaler's skips before any recorded step shows the layer names none, and "
        "is right where a later alert of the family names the layer by the second recorded "
        "step that shows it; where no recorded step shows the layer at all (a NaN whose "
        "update poisons every weight before the next recorded step), the right alert names "
        "none.\n\n" + text.strip() + "\n"
    )
    pattern = rf"## {re.escape(DOCS_TITLE)}\n.*?(?=\n## |\nGuides: |\Z)"
    if re.search(pattern, page, flags=re.S):
        page = re.sub(pattern, lambda _: section, page, flags=re.S)
    else:
        head, guides, tail = page.partition("\nGuides: ")
        page = head.rstrip() + "\n\n" + section + ("\n" + guides + tail if guides else "")
    DOCS.write_text(page)


def write(text: str, seconds: float, threads: int) -> None:
    """Put the table in its section of BENCHMARKS.md, with how it was made."""
    report.replace_section(
        TITLE,
        f"Machine: {report.machine(threads)}. Command: `{report.command('diagnosis.py')}` "
        f"({seconds:.0f} s). Each bug is planted at a known layer and step of a small model "
        "trained on scikit-learn's digits or a text made in code, and has a healthy twin (the "
        "same training without the bug); each run is watched with "
        "`layerscope.watch(model, optimizer=opt, run=None)` (the default schedule: every step "
        "of the first 10, then one in 100) and again with `every=10`, `attention=True` where "
        "the case says. *Said*: the first alert (warning or error, from the planted step on) "
        "of the expected family, else the first alert; *right*: that family, the case's "
        "layer, and at most one recorded step after the first step at which what was "
        "recorded shows the bug (*seen*: its statistics, recorded at the schedule's steps, "
        "or the loss, logged every step). Where the logged scalars show the bug before any "
        "recorded step shows its layer, an alert that names no layer is right if a later one "
        "of the family names the layer by the second recorded step that shows it; where no "
        "recorded step shows the layer (`origin_until`: a NaN whose update poisons every "
        "weight first), only an alert that names no layer is. False alarms: warnings or "
        "errors on the twins. The cases, their stories and why each layer and step: "
        "`benchmarks/diagnosis_zoo/`.\n\n" + text,
    )


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", help="run only the cases whose name holds this")
    parser.add_argument("--small", action="store_true", help="only the few cheap cases")
    parser.add_argument("--threads", type=int, default=1, help="torch's threads (default 1)")
    parser.add_argument("--json", type=Path, help="also write every alert of every run here")
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    args = parser.parse_args(argv)
    cases = chosen(args.case, args.small)
    # Tiny models gain nothing from a second thread, which on a busy machine waits for a
    # descheduled one.
    torch.set_num_threads(args.threads)
    # The alerts are the table's; their log lines would bury it.
    logging.getLogger("layerscope").setLevel(logging.CRITICAL)
    started = time.perf_counter()
    results = {}
    for case in cases:
        results[case.name] = run_case(case)
        print(f"{case.name}: done", file=sys.stderr)
    took = time.perf_counter() - started
    text = table(results)
    print(text)
    if args.json is not None:
        args.json.write_text(json.dumps(as_json(results), indent=1))
    if args.write:
        write(text, took, args.threads)
        write_docs(text)
    return text


if __name__ == "__main__":
    main()
