"""The damaged run.json and modules.json generated from their schema (``schema_cases``).

The checks refuse every wrong value, naming its field, and take every extreme of a range;
what the readers then do is tried on the values that once took a listing down, and on valid
extremes, through the readers that list and open a run: the benchmark tries them all, through
every reader.
"""

import pytest

pytest.importorskip("duckdb")
pytest.importorskip("starlette")

import classify
import damage_session
import schema_cases

from layerscope.store import RunFileError
from layerscope.store._file_checks import check_modules, check_run_meta, parse_json

CHECKS = {"run.json": check_run_meta, "modules.json": check_modules}
# The readers that list runs and open one: a refused file fails them first.
READERS = ("load", "modules", "runs", "ui:runs", "ui:run", "ui:modules")


@pytest.fixture(scope="session")
def classifier(tmp_path_factory, request):
    return damage_session.classifier(tmp_path_factory, request)


@pytest.fixture(scope="module")
def documents(classifier):
    return {name: (classifier.bases.single / name).read_text() for name in CHECKS}


def _checked(change, documents):
    path = f"/runs/run/{change.file}"
    payload = change.apply(documents[change.file]).encode()
    return CHECKS[change.file](path, parse_json(path, payload))


def _within(field, where):
    """Whether ``field`` is ``where`` or holds it (``config.histogram`` holds its ``.kind``)."""
    return where == field or where.startswith((f"{field}.", f"{field}["))


def _related(field, where):
    """The field named is the one changed, one that holds it, or one it holds (a list of
    wrong items is named at its first)."""
    return _within(field, where) or _within(where, field)


def test_every_wrong_value_of_every_field_is_refused_naming_the_field(documents):
    assert len(schema_cases.DAMAGING) > 1000
    assert len({change.where for change in schema_cases.DAMAGING}) > 70
    wrong = []
    for change in schema_cases.DAMAGING:
        try:
            _checked(change, documents)
        except RunFileError as error:
            whole = change.where == "" or change.label == "nested-100000"
            if not (error.field is None and whole) and not _related(
                error.field or "", change.where
            ):
                wrong.append(f"{change.where} {change.label}: named {error.field}: {error}")
        except Exception as error:
            wrong.append(f"{change.where} {change.label}: {type(error).__name__}: {error}")
        else:
            wrong.append(f"{change.where} {change.label}: taken")
    assert not wrong, "\n".join(wrong[:20])


def test_the_extremes_of_every_range_are_taken(documents):
    assert len(schema_cases.EXTREMES) > 40
    refused = []
    for change in schema_cases.EXTREMES:
        try:
            _checked(change, documents)
        except RunFileError as error:
            refused.append(f"{change.where} {change.label}: {error}")
    assert not refused, "\n".join(refused)


def test_what_fits_a_declaration_is_judged_by_type_and_range():
    from layerscope.store._file_schema import COUNT, TIME, Integer

    assert schema_cases.fits(COUNT, 2**63 - 1)
    assert not schema_cases.fits(COUNT, 2**63)
    assert not schema_cases.fits(COUNT, True)
    assert not schema_cases.fits(TIME, float("inf"))
    assert not schema_cases.fits(TIME, float("nan"))
    assert schema_cases.fits(TIME, 0)
    labels = {value.label for value in schema_cases.wrong_values(Integer(1, 10))}
    assert {"string", "bool", "float", "null", "below", "above", "nan", "10**400"} <= labels
    assert "null" not in {value.label for value in schema_cases.wrong_values(COUNT, null=True)}


# The values the listing fell over, and valid extremes a reader must take past the checks.
NAMED = (
    "gen-run.json-whole-nested-100000",
    "gen-modules.json-whole-nested-100000",
    "gen-run.json-config.histogram-nested-100000",
    "gen-run.json-started-infinity",
    "gen-run.json-started-1e300",
    "gen-run.json-steps-2**63",
    "gen-run.json-steps-10**400",
    "gen-run.json-pid-2**63",
    "gen-run.json-config.stats[0]-object",
    "gen-run.json-config.stats[0]-list",
    "gen-run.json-histogram_edges-256-infinite",
    "gen-run.json-config-null",
    "edge-run.json-steps-high",
    "edge-run.json-started-high",
    "edge-run.json-running-here-pid-2**31",
    "edge-run.json-linear-histogram-most-bins",
    "edge-modules.json-[0].parameters.x[0]-high",
)


SAMPLED = [case for case in schema_cases.CASES if case.name in NAMED]


def test_the_sample_is_of_generated_cases():
    assert len(SAMPLED) == len(NAMED)


@pytest.mark.parametrize("case", SAMPLED, ids=lambda case: case.name)
def test_a_generated_run_is_named_by_the_readers_that_list_and_open_it(classifier, case):
    outcomes = classifier.outcomes(case, READERS)
    assert [outcome.reader for outcome in outcomes] == list(READERS)
    bad = [outcome for outcome in outcomes if outcome.outcome in classify.BAD]
    assert not bad, "\n".join(f"{o.reader}: {o.outcome}: {o.detail}" for o in bad)
