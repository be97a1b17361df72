"""``layerscope demo``: the broken run's ReLUs die and say so, the fixed one learns; seeded."""

import contextlib
import io
import re
from pathlib import Path

import pytest

import layerscope

pytest.importorskip("sklearn")
pytest.importorskip("matplotlib")


def accuracy(out, name):
    section = out[out.index(f"{name}: ") :]
    return float(re.search(r"test accuracy\s+([\d.]+)%", section).group(1))


def without_times(out):
    return re.sub(r"in [\d.]+ s", "in - s", out)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from layerscope.cli import main

    out = tmp_path_factory.mktemp("demo") / "out"
    outputs = []
    for _ in range(2):  # the second replaces the first's runs
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            assert main(["demo", "--out", str(out), "--plain"]) == 0
        outputs.append(stdout.getvalue())
    return out, outputs


@pytest.mark.slow  # two trainings of the two runs, about 20 s
def test_the_broken_run_has_dead_alerts_and_the_fixed_one_none(demo):
    out, (first, _) = demo
    broken = layerscope.load(out / "broken").alerts
    fixed = layerscope.load(out / "fixed").alerts
    dead = broken[broken["rule"] == "dead"]
    assert {"1", "3"} <= set(dead["module"])  # both ReLUs
    assert fixed.empty
    assert accuracy(first, "broken") < 30
    assert accuracy(first, "fixed") > 90
    assert re.search(r"\n +\d+ +warning +dead +1 +activation", first)


@pytest.mark.slow
def test_it_writes_the_figures_and_gives_the_same_result_every_time(demo):
    out, (first, second) = demo
    assert without_times(first) == without_times(second)
    for name in ("broken", "fixed"):
        pngs = {path.stem for path in (out / name / "plots").glob("*.png")}
        assert {"dead_chart", "stats-activation", "color_dim-activation", "scalars"} <= pngs
    # The report holds both runs' answers, the broken one's dead alerts among them.
    report = (out / "report.html").read_text()
    assert "broken" in report
    assert "fixed" in report
    assert "is dying" in report
    assert "<script src=" not in report  # self-contained: nothing fetched


def test_a_folder_that_is_not_a_demos_is_left_alone(tmp_path, capsys):
    from layerscope.cli import main

    (tmp_path / "mine.txt").write_text("keep")
    assert main(["demo", "--out", str(tmp_path)]) == 2
    assert "is not empty and not a demo's folder" in capsys.readouterr().err
    assert (tmp_path / "mine.txt").read_text() == "keep"


@pytest.mark.slow
def test_the_readme_shows_this_output(demo):
    out, (first, _) = demo
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    shown = without_times(first.replace(str(out), "layerscope-demo"))
    assert shown in without_times(readme)
