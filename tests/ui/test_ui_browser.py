"""The page in a real headless Chromium: it draws, answers clicks and follows a live run.

Skipped where Playwright or Debian's /usr/bin/chromium is missing (scripts/test.sh installs
both). Screenshots of each view go to $LAYERSCOPE_SCREENSHOTS, or to the test's tmp_path.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from browsing import CHROMIUM, WAIT_MS, click_cell, plotted
from live_training import LiveTraining
from ui_runs import XSS_NAME, Server

from layerscope.ui._report import write_report

sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright")
if not os.path.exists(CHROMIUM):
    pytest.skip(f"needs Debian's chromium at {CHROMIUM}", allow_module_level=True)


@pytest.fixture
def screenshots(tmp_path):
    folder = Path(os.environ.get("LAYERSCOPE_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_the_runs_then_a_run(page, server, screenshots):
    page.goto(server.url + "/")
    page.wait_for_selector("#runs-table tbody tr")
    assert page.locator("#runs-table tbody tr").count() == 4
    page.screenshot(path=screenshots / "runs.png", full_page=True)
    page.get_by_role("link", name="exp1").click()
    plotted(page, "heatmap")
    plotted(page, "scalars")
    z = page.evaluate("document.getElementById('heatmap').data[0].z")
    assert len(z) == 3
    assert len(z[0]) == 6
    assert page.locator("#run-steps").inner_text() == "6 steps"
    page.wait_for_selector("#modules .module-name")  # the tree is filled in after the page
    assert "Linear" in page.locator("#modules").inner_text()
    overhead = page.locator("#overhead").inner_text()
    assert "training thread" in overhead
    assert "rows recorded\t84" in overhead  # 6 steps of 14 rows
    page.screenshot(path=screenshots / "run.png", full_page=True)


def test_clicking_a_cell_shows_that_layer(page, server, screenshots):
    page.goto(server.url + "/#/run/exp1")
    plotted(page, "heatmap")
    plotted(page, "series")
    click_cell(page, "heatmap", 2, 2)  # layer "2", step 2 (from step 3 on, NaN: no cell)
    page.wait_for_function("() => document.body.dataset.module === '2'", timeout=WAIT_MS)
    assert page.evaluate("document.body.dataset.step") == "2"
    page.wait_for_function(
        "() => document.getElementById('distribution').dataset.step === '2'", timeout=WAIT_MS
    )
    assert page.locator("#layer-name").inner_text().startswith("2 ")
    plotted(page, "colordim")
    series = page.evaluate("document.getElementById('series').data[0]")
    assert series["x"] == [0, 1, 2, 3, 4, 5]
    page.select_option("#series-stat", "std")
    page.wait_for_function(
        "() => document.getElementById('series').layout.title.text.startsWith('std')",
        timeout=WAIT_MS,
    )
    page.screenshot(path=screenshots / "layer.png", full_page=True)


def test_clicking_an_alert_moves_to_its_layer_and_step(page, server, screenshots):
    page.goto(server.url + "/#/run/exp1")
    plotted(page, "heatmap")
    page.wait_for_selector(".alert-row")
    page.select_option("#kind-select", "weight")  # the alert is an activation's
    page.wait_for_function("() => document.getElementById('kind-select').value === 'weight'")
    page.locator(".alert-row").first.click()
    page.wait_for_function(
        "() => document.body.dataset.step === '3' && document.body.dataset.module === '0'",
        timeout=WAIT_MS,
    )
    assert page.locator("#kind-select").input_value() == "activation"
    assert page.locator("#layer-step").inner_text() == "step 3"
    page.wait_for_function(
        "() => document.getElementById('heatmap').layout.shapes.some(s => s.x0 === 3)",
        timeout=WAIT_MS,
    )
    page.wait_for_function(
        "() => document.getElementById('distribution').dataset.step === '3'", timeout=WAIT_MS
    )
    page.screenshot(path=screenshots / "alert.png", full_page=True)


def test_names_are_shown_as_text(page, server, screenshots):
    page.goto(server.url + "/#/run/xss")
    plotted(page, "heatmap")
    page.wait_for_selector("#modules .module-name")
    assert XSS_NAME in page.locator("#modules").inner_text()
    assert page.locator("img").count() == 0  # no element made from the name
    ticks = page.evaluate(
        "() => Array.from(document.querySelectorAll('#heatmap .ytick text'), t => t.textContent)"
    )
    assert XSS_NAME in ticks
    page.screenshot(path=screenshots / "escaped.png", full_page=True)


def test_two_runs_side_by_side(page, server, screenshots):
    page.goto(server.url + "/#/run/exp1?compare=exp2")
    plotted(page, "heatmap")
    plotted(page, "heatmap-compare")
    assert len(page.evaluate("document.getElementById('heatmap-compare').data[0].x")) == 4
    assert page.locator("#compare-select").input_value() == "exp2"
    page.wait_for_function(
        "() => document.getElementById('scalars').data.some(t => t.name.includes('exp2'))",
        timeout=WAIT_MS,
    )
    page.screenshot(path=screenshots / "compare.png", full_page=True)


def test_the_rank_selector_shows_each_rank(page, server, screenshots):
    page.goto(server.url + "/#/run/ranks")
    plotted(page, "heatmap")
    assert page.evaluate("document.getElementById('heatmap').dataset.columns") == "3"
    page.select_option("#rank-select", "1")
    page.wait_for_function(
        "() => document.getElementById('heatmap').dataset.columns === '4'", timeout=WAIT_MS
    )
    assert "rank=1" in page.url
    page.wait_for_function(
        "() => document.getElementById('scalars').data[0].x.length === 4", timeout=WAIT_MS
    )
    page.screenshot(path=screenshots / "ranks.png", full_page=True)


def test_a_live_run_grows_without_a_reload(page, tmp_path, screenshots):
    root = tmp_path / "runs"
    root.mkdir()
    with Server(root) as server, LiveTraining(root / "live") as training:
        page.goto(server.url + "/#/run/live")
        plotted(page, "heatmap")
        assert page.evaluate("document.getElementById('heatmap').dataset.columns") == "2"
        page.evaluate("window.notReloaded = true")
        training.next_round()
        page.wait_for_function(
            "() => document.getElementById('heatmap').dataset.columns === '4'", timeout=WAIT_MS
        )
        page.wait_for_selector(".alert-row", timeout=WAIT_MS)  # the NaN at step 3
        assert page.evaluate("window.notReloaded") is True
        assert page.locator("#run-steps").inner_text() == "4 steps"
        page.screenshot(path=screenshots / "live.png", full_page=True)


def test_the_report_draws_every_chart_offline(browser, runs_root, tmp_path, screenshots):
    path = tmp_path / "report.html"
    write_report(runs_root / "exp1", path, compare=runs_root / "exp2")
    context = browser.new_context(offline=True, viewport={"width": 1400, "height": 1000})
    requested: list[str] = []

    def only_the_file(route):
        if route.request.url.startswith("file:"):
            route.continue_()
        else:
            requested.append(route.request.url)
            route.abort()

    context.route("**/*", only_the_file)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(path.as_uri())
    for element_id in ["scalars", "heatmap", "heatmap-compare", "series", "colordim"]:
        plotted(page, element_id)
    plotted(page, "distribution")
    assert page.locator(".js-plotly-plot .main-svg").count() >= 6
    click_cell(page, "heatmap", 1, 2)
    page.wait_for_function("() => document.body.dataset.module === '1'", timeout=WAIT_MS)
    page.wait_for_function(
        "() => document.getElementById('distribution').dataset.step === '2'", timeout=WAIT_MS
    )
    page.screenshot(path=screenshots / "report.png", full_page=True)
    context.close()
    assert requested == []
    assert errors == []


def test_a_malformed_address_shows_the_runs(page, server):
    page.goto(server.url + "/#/run/%E0%A4%A")
    page.wait_for_selector("#runs-table tbody tr")
    assert page.evaluate("location.hash") == "#/"
    page.goto(server.url + "/#/run/exp1?rank=-3")
    plotted(page, "heatmap")
