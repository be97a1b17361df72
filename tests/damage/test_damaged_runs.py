"""Every reader on every damaged or crafted run: a clean error naming the file, the rows the run
recorded, or part of them with the file left out named; never a traceback, a 500, an error
that names nothing, wrong rows, or SQL that ran (see ``classify`` for the rules).
"""

from collections import Counter

import pytest

pytest.importorskip("duckdb")
pytest.importorskip("starlette")

import classify
import corpus
import damage_session
import hostile_cases

# A case of each kind of hostile_cases read in this process; the others, and those read in a
# process of their own (bounded in memory, or as another user: seconds to start each), are the
# benchmark's (benchmarks/damage.py), and tests/store/test_store_special_files.py and
# test_store_permissions.py try those kinds.
HOSTILE = (
    "fifo-run.json",
    "calls-device-null",
    "stats-segment-corrupt-pages",
    "folder-named-a?",
    "escapes-in-module-name",
)


@pytest.fixture(scope="session")
def classifier(tmp_path_factory, request):
    return damage_session.classifier(tmp_path_factory, request)


@pytest.mark.parametrize(
    "case",
    [*corpus.CASES, *(case for case in hostile_cases.CASES if case.name in HOSTILE)],
    ids=lambda case: case.name,
)
def test_every_reader_names_what_it_cannot_read(classifier, case):
    outcomes = classifier.outcomes(case)
    assert [outcome.reader for outcome in outcomes] == list(classify.READERS)
    bad = [outcome for outcome in outcomes if outcome.outcome in classify.BAD]
    assert not bad, "\n".join(f"{o.reader}: {o.outcome}: {o.detail}" for o in bad)


def test_the_hostile_cases_tried_here_are_some_of_the_corpus():
    assert set(HOSTILE) < {case.name for case in hostile_cases.CASES}
    kinds = {case.family for case in hostile_cases.CASES}
    assert kinds == {"pipes", "devices", "pages", "permissions", "paths", "escapes"}


def test_the_corpus_is_large_and_names_its_files():
    assert len(corpus.CASES) >= 70
    families = Counter(case.family for case in corpus.CASES)
    for family in ("run.json", "modules.json", "stats", "scalars", "alerts", "calls", "ranks"):
        assert families[family] >= 3, family
    assert families["beside"] >= 2
    # A damaged case says what a reader should name; a crafted or untouched one, nothing.
    for case in corpus.CASES:
        undamaged = case.crafted or case.family == "control" or case.name.endswith("-control")
        assert bool(case.names) != undamaged, case.name


def test_names_tells_the_root_run_json_from_a_rank_s():
    case = corpus.BY_NAME["run.json-list"]
    assert classify.names(case, "/tmp/x/runs/run/run.json: expected a JSON object")
    assert classify.names(case, "path: no run at /tmp/x (no run.json)")
    assert not classify.names(case, "/tmp/x/runs/run/rank-00001/run.json: not JSON")
    assert not classify.names(case, "no such run")
    table = corpus.BY_NAME["stats-folder-emptied"]
    assert classify.names(table, "/tmp/x/runs/run/stats: its files hold 0 rows")
    assert not classify.names(table, "no stats recorded for phase train")
    rank = corpus.BY_NAME["rank-copied-from-rank-0"]
    assert classify.names(rank, "skipped /tmp/x/runs/run/rank-00001/stats/seg-000001.parquet")


def _rows(*rows):
    return classify.Rows(("step", "module"), tuple(rows))


@pytest.mark.parametrize(
    ("rows", "said", "expected"),
    [
        ([(0, "a"), (1, "a")], "", "ok"),
        ([(0, "a")], "", "partial-unlabelled"),
        ([(0, "a")], "skipped /r/runs/run/stats/seg-000002.parquet", "partial-labelled"),
        ([], "", "silently-wrong"),
        ([], "skipped /r/runs/run/stats/seg-000002.parquet", "partial-labelled"),
        ([(0, "a"), (0, "a"), (1, "a")], "", "silently-wrong"),
        ([(0, None), (1, "a")], "skipped /r/runs/run/stats/seg-000002.parquet", "silently-wrong"),
    ],
)
def test_rows_are_judged_against_the_recorded_ones(rows, said, expected):
    case = corpus.BY_NAME["stats-segment-garbage"]
    recorded = classify.Reading("value", _rows((0, "a"), (1, "a")), compare="rows")
    reading = classify.Reading("value", _rows(*rows), said=said, compare="rows")
    assert classify.judge(case, "stats", reading, recorded).outcome == expected


@pytest.mark.parametrize(
    ("reading", "expected"),
    [
        (classify.Reading("error", message="ValueError: /r/runs/run/run.json: bad"), "named"),
        (classify.Reading("error", message="404: no such run"), "unnamed-error"),
        (classify.Reading("error", message="<not one line, or exit status 1> x"), "unnamed-error"),
        (classify.Reading("traceback", message="KeyError: 'rank'"), "traceback"),
        (classify.Reading("500", message="TypeError"), "500"),
        (classify.Reading("value", 1, injected=("INJECTED.csv",), compare="count"), "injected"),
    ],
)
def test_failures_are_judged_by_what_they_say(reading, expected):
    case = corpus.BY_NAME["run.json-list"]
    good = classify.Reading("value", 1, compare="count")
    assert classify.judge(case, "load", reading, good).outcome == expected


def test_an_injected_file_is_found_and_removed(tmp_path, monkeypatch):
    duckdb = pytest.importorskip("duckdb")
    watch = classify.InjectionWatch(tmp_path)
    monkeypatch.chdir(tmp_path)
    duckdb.sql("copy (select 1 as x) to 'INJECTED.csv'")
    reading = watch.checked(classify.Reading("value", 1))
    assert reading.injected == (str(tmp_path / "INJECTED.csv"),)
    assert not (tmp_path / "INJECTED.csv").exists()
    assert watch.checked(classify.Reading("value", 1)).injected == ()


def test_a_command_s_note_of_what_it_left_out_is_no_content():
    case = corpus.BY_NAME["stats-copied-as-seg-000099"]
    recorded = classify.Reading("value", ("run", "layers", "0  1.0"), compare="lines")
    note = ("", "files left out (damaged)", "/r/runs/run/stats/seg-000099.parquet  a copy")
    same = classify.Reading("value", (*recorded.value, *note), compare="lines")
    assert classify.judge(case, "summary", same, recorded).outcome == "ok"
    fewer = classify.Reading("value", ("run", "layers", *note), compare="lines")
    assert classify.judge(case, "summary", fewer, recorded).outcome == "partial-unlabelled"
    said = classify.Reading("value", fewer.value, said=note[2], compare="lines")
    assert classify.judge(case, "summary", said, recorded).outcome == "partial-labelled"
