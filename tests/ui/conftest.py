"""A folder of small real runs, and one dashboard server over it for each test module."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("plotly")

from browsing import ARGS, CHROMIUM
from ui_runs import (
    LINEAR_HISTOGRAM,
    Server,
    dead_model,
    many_alerts,
    record,
    tanh_model,
    write_alerts,
    xss_model,
)


@pytest.fixture(scope="session")
def runs_root(tmp_path_factory):
    """``exp1`` (6 steps, a NaN at step 3: one alert), ``exp2`` (4 steps), ``xss``, and
    ``ranks``, written by two ranks (3 steps of rank 0, 4 of rank 1)."""
    root = tmp_path_factory.mktemp("ui") / "runs"
    record(root / "exp1", 6, nan_at=3)
    record(root / "exp2", 4)
    record(root / "xss", 2, model=xss_model())
    with pytest.MonkeyPatch.context() as patch:
        for rank in (0, 1):  # as torchrun would launch them: the rank in the environment
            patch.setenv("RANK", str(rank))
            patch.setenv("WORLD_SIZE", "2")
            record(root / "ranks", 3 + rank, seed=rank)
    return root


@pytest.fixture(scope="module")
def server(runs_root):
    with Server(runs_root) as running:
        yield running


@pytest.fixture(scope="session")
def pictures_root(tmp_path_factory):
    """Runs whose pictures are easy to get wrong: ``dead`` (a ReLU of exact zeros only, 4
    steps), ``tanh`` (a Tanh where ``dead`` has its ReLU, 4 steps), ``nan`` (a NaN at step 3:
    NaN counts of 0, then more), ``linear`` (a linear histogram, 3 steps) and ``alerts``
    (6 steps, 118 alerts of 3 rules)."""
    root = tmp_path_factory.mktemp("pictures") / "runs"
    record(root / "dead", 4, model=dead_model())
    record(root / "tanh", 4, model=tanh_model())
    record(root / "nan", 6, nan_at=3)
    record(root / "linear", 3, histogram=LINEAR_HISTOGRAM)
    record(root / "alerts", 6, nan_at=3)  # one alert: its table has a file to replace
    write_alerts(root / "alerts", many_alerts())
    return root


@pytest.fixture(scope="module")
def pictures(pictures_root):
    with Server(pictures_root) as running:
        yield running


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium; the test skipped where Playwright or /usr/bin/chromium is missing."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"needs Debian's chromium at {CHROMIUM}")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser):
    """A page that records script errors, dialogs and failed requests; none are allowed."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    opened = context.new_page()
    problems: list[str] = []
    opened.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    opened.on("dialog", lambda dialog: (problems.append(f"dialog: {dialog.message}"),
                                        dialog.dismiss()))  # fmt: skip
    opened.on(
        "console",
        lambda message: (
            problems.append(f"console: {message.text}") if message.type == "error" else None
        ),
    )
    yield opened
    context.close()
    assert problems == []
