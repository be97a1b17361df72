"""``layerscope demo``: the broken run's ReLUs die and say so, the fixed one learns; seeded.

The story (which rules fire on which layers at which steps, and the two accuracies' order) is
the same on any CPU, so it is checked exactly, also under perturbations larger than another
CPU's rounding. The digits that rounding changes (accuracies, times, statistics) are masked
where the README's copy of the output is compared, not in the README.
"""

import contextlib
import io
import re
from pathlib import Path

import pytest
import torch

import layerscope

pytest.importorskip("sklearn")
pytest.importorskip("matplotlib")

ROOT = Path(__file__).parents[2]

# The broken run's alerts, (step, severity, rule, module, kind): both ReLUs die by step 5, so
# the dead rule sees 2 recorded steps (every 5th) of a ReLU's output all zero at step 10.
STORY = [
    (10, "warning", "dead", "1", "activation"),
    (10, "warning", "dead", "3", "activation"),
]
# A number, unless it follows "step ": the alerts' messages name steps, which are exact.
MEASURE = re.compile(r"(?<!step )(?<![\w.])-?\d+(?:\.\d+)?(?:e[+-]?\d+)?%?")
DECIMAL = re.compile(r"\d+\.\d+%?")


def story(path):
    alerts = layerscope.load(path).alerts
    columns = ["step", "severity", "rule", "module", "kind"]
    return sorted(zip(*(alerts[column].tolist() for column in columns), strict=True))


def accuracy(out, name):
    section = out[out.index(f"{name}: ") :]
    return float(re.search(r"test accuracy\s+([\d.]+)%", section).group(1))


def without_times(out):
    return re.sub(r"in [\d.]+ s", "in - s", out)


def comparable(out):
    """The demo's printed output as lines that any CPU prints alike.

    Exact: the lines and sections, the counts of steps and alerts, each alert's step, severity,
    rule, module, kind and tensor, and the layer table's modules and types. Masked: decimals
    (accuracies, times), the alerts' measures, the layer table's statistics, and the column
    widths that these set.
    """
    lines, section = [], ""
    for line in out.strip().splitlines():
        fields = ["-" if set(field) == {"-"} else field for field in line.split()]
        if not fields:
            section = ""
        elif section == "layers":
            fields = fields[:2]
        elif section == "alerts":
            fields = [*fields[:6], MEASURE.sub("#", " ".join(fields[6:]))]
        else:  # a section's title, or a line of fields
            section = (
                "alerts" if line == "alerts" else "layers" if line.startswith("layers (") else ""
            )
            fields = [DECIMAL.sub("#", field) for field in fields]
        lines.append(" ".join(fields))
    return lines


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


@pytest.mark.slow  # two trainings of the two runs, about 25 s
def test_the_broken_runs_relus_die_and_the_fixed_one_learns(demo):
    out, (first, _) = demo
    assert story(out / "broken") == STORY
    assert story(out / "fixed") == []
    assert accuracy(first, "broken") < 30 < 90 < accuracy(first, "fixed")
    assert re.search(r"\n +10 +warning +dead +1 +activation", first)


@pytest.mark.slow
@pytest.mark.parametrize("perturbation", ["weights", "pixels", "no oneDNN"])
def test_the_story_holds_where_the_numbers_round_otherwise(demo, perturbation, monkeypatch):
    """As on another CPU: initial weights or pixels off by 1e-6 of themselves, or convolutions
    computed without oneDNN (in another order)."""
    from layerscope.cli import _demo_training as training

    out, _ = demo
    noise = torch.Generator().manual_seed(1)

    def noisy(tensor):
        return tensor * (1 + 1e-6 * torch.randn(tensor.shape, generator=noise))

    cnn, digits = training.cnn, training.digits

    def noisy_cnn(normalise):
        model = cnn(normalise)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.copy_(noisy(parameter))
        return model

    def noisy_digits():
        images, labels = digits()
        return noisy(images), labels

    if perturbation == "weights":
        monkeypatch.setattr(training, "cnn", noisy_cnn)
    if perturbation == "pixels":
        monkeypatch.setattr(training, "digits", noisy_digits)
    if perturbation == "no oneDNN":
        monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)
    broken, fixed = [
        training.train(recipe, out.parent / perturbation / recipe.name, lambda line: None)
        for recipe in (training.BROKEN, training.FIXED)
    ]
    # The numbers did change: a perturbation that changed nothing would prove nothing.
    losses = [layerscope.load(path).scalars["value"] for path in (out / "fixed", fixed.path)]
    assert not losses[0].equals(losses[1])
    assert story(broken.path) == STORY
    assert story(fixed.path) == []
    assert broken.accuracy < 0.3 < 0.9 < fixed.accuracy


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


def printed(text):
    """The demo's printed output in ``text`` (the README, a docs snippet): its sections."""
    start = text.index("broken: raw pixels")
    end = text.find("```", start)
    return text[start : end if end >= 0 else None]


def test_the_comparison_masks_the_digits_and_keeps_the_story():
    shown = printed((ROOT / "README.md").read_text())
    # As another CPU prints it: other last digits everywhere, so other column widths too.
    other_cpu = re.sub(r"(\d+\.\d+)", r"\g<1>7", shown).replace("----", "-----")
    assert other_cpu != shown
    assert comparable(other_cpu) == comparable(shown)
    for other_story in (
        shown.replace("  10  warning   dead  1", "  20  warning   dead  1"),
        shown.replace("\n3       ReLU", "\n3       GELU"),
        shown.replace("2 alerts (2 warning)", "3 alerts (3 warning)"),
    ):
        assert other_story != shown
        assert comparable(other_story) != comparable(shown)


@pytest.mark.slow
def test_the_readme_shows_this_output(demo):
    out, (first, _) = demo
    shown = printed((ROOT / "README.md").read_text())
    assert comparable(first.replace(str(out), "layerscope-demo")) == comparable(shown)


def test_the_docs_show_the_same_output_as_the_readme():
    readme = printed((ROOT / "README.md").read_text())
    docs = printed((ROOT / "docs" / "snippets" / "demo.out").read_text())
    assert comparable(docs) == comparable(readme)
