"""The documentation site builds strictly, documents the public API, and shows real output."""

from __future__ import annotations

import html
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import layerscope

ROOT = Path(__file__).resolve().parents[1]
SNIPPETS = ROOT / "docs" / "snippets"

# Each API page and the objects it must document, by the anchor mkdocstrings gives them.
API_PAGES = {
    "reference/watch": ["layerscope.watch", "layerscope.Scope", "layerscope.Scope.step"],
    "reference/run": [
        "layerscope.load",
        "layerscope.Run",
        "layerscope.Run.sql",
        "layerscope.Run.stats",
        "layerscope.runs",
        "layerscope.precision",
        "layerscope.store.FrameTooLargeError",
        "layerscope.store.ParquetStore",
    ],
    "reference/schedule": ["layerscope.Schedule"],
    "reference/capture": [
        "layerscope.capture",
        "layerscope.load_capture",
        "layerscope.tensors.Capture",
        "layerscope.tensors.Capture.to_frame",
        "layerscope.tensors.SavedCapture",
    ],
    "reference/plots": [
        "layerscope.plots.RunPlots",
        "layerscope.plots.RunPlots.stats",
        "layerscope.animate",
    ],
    "reference/sinks": [
        "layerscope.sinks.Sink",
        "layerscope.sinks.TensorBoard",
        "layerscope.sinks.WandB",
        "layerscope.sinks.MLflow",
        "layerscope.sinks.NullSink",
        "layerscope.sinks.MemorySink",
    ],
    "reference/health": ["layerscope.health.RULES", "layerscope.health.dead_units"],
    "reference/integrations": [
        "layerscope.integrations.lightning.LayerscopeCallback",
        "layerscope.integrations.transformers.LayerscopeCallback",
    ],
    "reference/misc": ["layerscope.NonFiniteError", "layerscope.Kind"],
}

# Snippets whose output does not depend on the time, the machine's name or a random id: the
# pages show what they print, and running them again prints the same. Those that write the
# runs the shell snippets read run with them, in tests/test_doc_outputs.py.
STABLE_SNIPPETS = [
    "memory", "merging", "recorded", "steps", "rules", "precision", "attention", "custom_sink",
    "capture_grads", "capture_stash", "selection", "noise_scale",
]  # fmt: skip


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mkdocs", reason="the docs need: pip install -e '.[docs]'")
    pytest.importorskip("mkdocstrings_handlers.python", reason="pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "WARNING" not in result.stderr, result.stderr
    return out


def _page(site: Path, name: str) -> str:
    return (site / name / "index.html").read_text(encoding="utf-8")


def _text(page: str) -> str:
    """The page's text: tags (syntax highlighting's spans among them) out, entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", page))


@pytest.mark.parametrize("page", sorted(API_PAGES))
def test_api_pages_document_their_objects(site: Path, page: str) -> None:
    html = _page(site, page)
    missing = [name for name in API_PAGES[page] if f'id="{name}"' not in html]
    assert not missing, f"{page} lacks {missing}"


def test_every_public_class_and_function_is_in_the_api_reference(site: Path) -> None:
    html = "".join(_page(site, page) for page in API_PAGES)
    public = [
        name
        for name in layerscope.__all__
        if isinstance(getattr(layerscope, name), type) or callable(getattr(layerscope, name))
    ]
    assert "watch" in public
    missing = [name for name in public if f'id="layerscope.{name}"' not in html]
    assert not missing


def test_examples_render_as_code_not_quotes(site: Path) -> None:
    # The docstrings' "Example:" sections hold ">>>" lines: code, not nested block quotes.
    html = _page(site, "reference/schedule")
    assert "<blockquote>" not in html
    assert "schedule.records(step)" in _text(html)


def test_pages_show_the_code_and_output_of_their_snippets(site: Path) -> None:
    page = _text(_page(site, "quickstart"))
    code = (SNIPPETS / "quickstart.py").read_text().splitlines()
    output = (SNIPPETS / "quickstart.out").read_text().splitlines()
    for line in [code[9], *output[:3]]:  # the watch line, the run, the table's first rows
        assert line in page


@pytest.mark.slow
@pytest.mark.parametrize("name", STABLE_SNIPPETS)
def test_snippet_prints_what_its_page_shows(tmp_path: Path, name: str) -> None:
    pytest.importorskip("pandas")
    pytest.importorskip("duckdb")
    environment = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, str(SNIPPETS / f"{name}.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    shown = (SNIPPETS / f"{name}.out").read_text()
    printed = result.stdout + result.stderr
    assert printed == shown or _same_lines(printed, shown), printed


def _same_lines(printed: str, shown: str) -> bool:
    """The same lines, their numbers to 1e-4 relative: in any order (the page captured stdout
    and stderr together, which interleave by timing), and on any CPU (whose kernels round
    the last digits of a float32 run their own way)."""
    ours, theirs = sorted(printed.splitlines()), sorted(shown.splitlines())
    if len(ours) != len(theirs):
        return False
    left = sorted(ours, key=_without_numbers)
    right = sorted(theirs, key=_without_numbers)
    return all(_same_line(a, b) for a, b in zip(left, right, strict=True))


_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
# The statistics kernel a run names (run.json's "kernel"): the best this CPU runs.
_KERNEL = re.compile(r"'(?:native-avx512|native-avx2|native|triton|compiled|eager)'")


def _without_numbers(line: str) -> str:
    return _NUMBER.sub("#", _KERNEL.sub("'<kernel>'", " ".join(line.split())))


def _same_line(a: str, b: str) -> bool:
    if _without_numbers(a) != _without_numbers(b):
        return False
    a, b = _KERNEL.sub("", a), _KERNEL.sub("", b)
    numbers = zip(_NUMBER.findall(a), _NUMBER.findall(b), strict=True)
    return all(math.isclose(float(x), float(y), rel_tol=1e-4) for x, y in numbers)


def test_the_help_snippet_shows_what_the_command_prints() -> None:
    command = Path(sys.executable).parent / "layerscope"  # the console script, as a user runs it
    result = subprocess.run(
        [str(command), "--help"], capture_output=True, text=True, timeout=120, check=True
    )
    assert (SNIPPETS / "help.out").read_text() == "$ layerscope --help\n" + result.stdout
