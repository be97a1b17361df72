"""What the page draws where pictures are easy to get wrong, in a real headless Chromium:
exact zeros, values a log axis cannot draw, linear histograms, compared runs, a run being
written, many alerts; in the dashboard and in the report."""

from __future__ import annotations

import math
import shutil

import pytest
from browsing import WAIT_MS, click_cell, hover_cell, plotted
from live_training import LiveTraining
from ui_runs import Server, record

from layerscope.ui._report import write_report


def open_report(browser, path):
    context = browser.new_context(offline=True, viewport={"width": 1400, "height": 1000})
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    opened.goto(path.as_uri())
    return context, opened, errors


def zero_cells(page, element_id: str) -> dict:
    """The heat map's traces: which cells each colours, and the legend's names."""
    return page.evaluate(
        """id => {
            const node = document.getElementById(id);
            const maps = node.data.filter(t => t.type === 'heatmap');
            return { drawn: maps.map(t => t.z.map(row => row.map(v => v !== null))),
                     legend: Array.from(node.querySelectorAll('.legendtext'), t => t.textContent) };
        }""",
        element_id,
    )


def assert_zeros_are_drawn(drawn: dict) -> None:
    # Row "1" (the ReLU) is all exact zeros: some trace colours each of its cells.
    rows = [any(trace[1][column] for trace in drawn["drawn"]) for column in range(4)]
    assert rows == [True] * 4
    assert "0 (no log10)" in drawn["legend"]


def test_exact_zeros_are_coloured_hovered_and_clicked(
    page, pictures, pictures_root, tmp_path, browser
):
    page.goto(pictures.url + "/#/run/dead")  # absmax: a log colour scale, where 0 has no log
    plotted(page, "heatmap")
    assert_zeros_are_drawn(zero_cells(page, "heatmap"))
    label = hover_cell(page, "heatmap", 1, 2)
    assert "1 (ReLU)" in label
    assert "absmax 0" in label
    click_cell(page, "heatmap", 1, 1)
    page.wait_for_function(
        "() => document.body.dataset.module === '1' && document.body.dataset.step === '1'",
        timeout=WAIT_MS,
    )

    path = tmp_path / "dead.html"
    write_report(pictures_root / "dead", path)
    context, report, errors = open_report(browser, path)
    plotted(report, "heatmap")
    assert_zeros_are_drawn(zero_cells(report, "heatmap"))
    context.close()
    assert errors == []


def test_an_all_zero_tensor_draws_a_zero_bar(page, pictures):
    page.goto(pictures.url + "/#/run/dead")
    plotted(page, "distribution")
    page.get_by_role("link", name="1", exact=True).click()  # the ReLU, from the module tree
    page.wait_for_function(
        "() => document.body.dataset.module === '1'"
        " && document.getElementById('distribution').dataset.module === '1'",
        timeout=WAIT_MS,
    )
    bars = page.evaluate("document.getElementById('distribution').data[0]")
    heights = dict(zip(bars["x"], bars["y"], strict=True))
    assert heights["0"] == 1.0  # every element is an exact zero
    assert sum(heights.values()) == 1.0


def test_a_fraction_is_coloured_from_0_to_1_whatever_its_spread(page, pictures):
    # tanh's outputs: about half negative at every layer, so autoscaled colours would span a
    # few hundredths around 0.5 and paint 0.49 as "none" and 0.51 as "all".
    page.goto(pictures.url + "/#/run/tanh")
    plotted(page, "heatmap")
    page.select_option("#stat-select", "neg_frac")
    page.wait_for_function(
        "() => (document.getElementById('heatmap').data[0].colorbar.title.text || '')"
        ".includes('neg_frac')",
        timeout=WAIT_MS,
    )
    trace = page.evaluate("document.getElementById('heatmap').data[0]")
    values = [v for row in trace["z"] for v in row if v is not None]
    assert min(values) > 0  # the spread is narrower than the scale
    assert max(values) < 1
    assert (trace["zmin"], trace["zmax"], trace["zauto"]) == (0, 1, False)


def test_the_histogram_over_steps_draws_zeros_and_never_a_count_of_0(page, pictures):
    page.goto(pictures.url + "/#/run/dead")
    plotted(page, "heatmap")
    click_cell(page, "heatmap", 1, 1)  # the ReLU: every output an exact zero
    page.wait_for_function(  # module 1's histogram drawn: its zeros row holds counts
        "() => document.body.dataset.module === '1'"
        " && ((document.getElementById('colordim').data || [{}])[0].z || [[]])[0]"
        ".some(v => v !== null)",
        timeout=WAIT_MS,
    )
    colour = page.evaluate(
        "(() => { const t = document.getElementById('colordim').data[0];"
        " return { y: t.y, z: t.z, zmin: t.zmin }; })()"
    )
    assert colour["y"][0] == "0"
    assert colour["y"][-1] == "Inf/NaN"
    assert all(value is not None and value > 0 for value in colour["z"][0])  # 48 zeros a step
    assert all(value is None for row in colour["z"][1:] for value in row)  # nothing else
    assert colour["zmin"] == 0


def test_each_scalar_is_drawn_on_an_axis_of_its_own_titled_with_its_name(page, pictures):
    page.goto(pictures.url + "/#/run/tanh")  # its scalars: loss, and lr at 0.1 every step
    plotted(page, "scalars")
    axes = page.evaluate(
        """() => {
            const node = document.getElementById('scalars');
            const layout = node._fullLayout;
            return node.data.filter(t => t.name !== 'alerts').map(t => {
                const axis = layout['yaxis' + (t.yaxis === 'y' ? '' : t.yaxis.slice(1))];
                return [t.name, axis.title.text, axis.overlaying || null, axis.domain];
            });
        }"""
    )
    assert [(name, title, overlaying) for name, title, overlaying, _ in axes] == [
        ("loss", "loss", None),  # the loss first
        ("lr", "lr", None),
    ]
    (loss_bottom, _), (_, lr_top) = axes[0][3], axes[1][3]
    assert lr_top < loss_bottom  # one below the other, not drawn over it


def test_an_unknown_run_says_so_and_leaves_no_error_unhandled(browser, pictures):
    # Its answers are 404s, which the console logs: a page of its own, not the strict one.
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    opened.goto(pictures.url + "/#/run/no-such-run")
    opened.wait_for_function(
        "() => document.body.innerText.includes('no such run')", timeout=WAIT_MS
    )
    opened.wait_for_load_state("networkidle")  # every answer asked for has failed by now
    context.close()
    assert errors == []


def test_runs_of_one_name_in_two_folders_are_told_apart(page, tmp_path):
    record(tmp_path / "baseline", 1)
    shutil.copytree(tmp_path / "baseline", tmp_path / "baseline-old")  # its name stays
    record(tmp_path / "other", 1)
    with Server(tmp_path) as server:
        page.goto(server.url + "/#/")
        page.wait_for_selector("#runs-table tbody tr")
        rows = page.locator("#runs-table tbody tr td:first-child").all_inner_texts()
    assert sorted(" ".join(row.split()) for row in rows) == [
        "baseline baseline",
        "baseline baseline-old",
        "other",  # a name of its own needs no folder
    ]


_BOXES = """([id, selectors]) => {
    const node = document.getElementById(id);
    return selectors.map(s => Array.from(node.querySelectorAll(s),
                                         e => e.getBoundingClientRect().toJSON()));
}"""


def _overlap(a: dict, b: dict) -> bool:
    return min(a["right"], b["right"]) > max(a["left"], b["left"]) and min(
        a["bottom"], b["bottom"]
    ) > max(a["top"], b["top"])


def test_no_legend_or_axis_title_is_drawn_over_a_title_or_a_label_at_1000_px(browser, pictures):
    context = browser.new_context(viewport={"width": 1000, "height": 1000})
    opened = context.new_page()
    opened.goto(pictures.url + "/#/run/dead?compare=tanh")  # its exact zeros: a legend
    plotted(opened, "heatmap-compare")
    plotted(opened, "distribution")
    legends, titles, ticks, axis_titles = opened.evaluate(
        _BOXES, ["heatmap", [".legend", ".gtitle", ".xtick text", ".xtitle"]]
    )
    [bars_ticks, bars_title] = opened.evaluate(_BOXES, ["distribution", [".xtick text", ".xtitle"]])
    context.close()
    assert legends
    assert not [b for a in legends for b in titles + ticks + axis_titles if _overlap(a, b)]
    assert bars_title
    assert not [b for a in bars_title for b in bars_ticks if _overlap(a, b)]


def test_compared_maps_of_the_same_layers_put_them_in_the_same_rows(page, pictures):
    page.goto(pictures.url + "/#/run/dead?compare=tanh")  # 3 layers each; dead's has zeros
    plotted(page, "heatmap-compare")
    rows = page.evaluate(
        "() => ['heatmap', 'heatmap-compare'].map(id => {"
        " const axis = document.getElementById(id)._fullLayout.yaxis;"
        " return [axis._offset, axis._length]; })"
    )
    assert rows[0] == rows[1]  # the same top and height: row for row


def test_a_log_axis_marks_the_values_it_cannot_draw(page, pictures):
    page.goto(pictures.url + "/#/run/nan")  # layer "0": NaN counts 0, 0, 0, 8, 48, 48
    plotted(page, "series")
    page.select_option("#series-stat", "nan_count")
    page.wait_for_function(
        "() => document.getElementById('series').layout.title.text.startsWith('nan_count')",
        timeout=WAIT_MS,
    )
    figure = page.evaluate(
        "(() => { const n = document.getElementById('series');"
        " return { data: n.data, title: n.layout.title.text, type: n._fullLayout.yaxis.type }; })()"
    )
    assert figure["type"] == "log"
    marked = [trace for trace in figure["data"] if trace.get("yaxis") == "y2"]
    assert [trace["x"] for trace in marked] == [[0, 1, 2]]
    assert "3 values ≤ 0 not drawn on log axis" in figure["title"]


def tick_labels(page, element_id: str) -> list[str]:
    return page.evaluate(
        "id => Array.from(document.querySelectorAll('#' + id + ' .ytick text'),"
        " t => t.textContent)",
        element_id,
    )


def is_decade(label: str) -> bool:
    power = math.log10(float(label))
    return abs(power - round(power)) < 1e-9


@pytest.mark.parametrize("stat", ["absmax", "nan_count"])
def test_log_axes_label_decades_only(page, pictures, stat):
    # absmax of layer "0" spans less than a decade (1.5 to 3); its NaN counts 8 to 48.
    page.goto(pictures.url + "/#/run/nan")
    plotted(page, "series")
    page.select_option("#series-stat", stat)
    page.wait_for_function(
        "stat => document.getElementById('series').layout.title.text.startsWith(stat)",
        arg=stat,
        timeout=WAIT_MS,
    )
    labels = tick_labels(page, "series")
    assert len(labels) >= 2
    assert all(is_decade(label) for label in labels), labels


def test_a_log_axis_labels_its_decades_in_one_format_clear_of_its_minor_ticks(page, pictures):
    page.goto(pictures.url + "/#/run/nan")
    plotted(page, "series")
    wide = page.evaluate("window.layerscope.figures.decadeAxis(2e-5, 0.03)")
    assert wide["ticktext"] == ["1e-5", "1e-4", "1e-3", "1e-2", "1e-1"]  # not 0.001 among them
    narrow = page.evaluate("window.layerscope.figures.decadeAxis(0.002, 0.3)")
    assert narrow["ticktext"] == ["0.001", "0.01", "0.1", "1"]
    assert wide["minor"]["ticks"] == "inside"  # the labels are outside


def test_a_linear_histogram_is_drawn_in_value_units(
    page, pictures, pictures_root, browser, tmp_path
):
    def check(opened):
        plotted(opened, "colordim")
        plotted(opened, "distribution")
        colour = opened.evaluate(
            "(() => { const n = document.getElementById('colordim');"
            " return { y: n.data[0].y, ticks: n.layout.yaxis.ticktext }; })()"
        )
        assert colour["y"][0] == pytest.approx(-1.2)
        assert colour["y"][-1] == pytest.approx(1.2)
        assert len(colour["y"]) == 11  # the edges of 10 slots: underflow, 8 bins, overflow
        assert colour["ticks"][0] == "< -1"
        assert colour["ticks"][-1] == "≥ 1"
        # The edges between, the last one too; lo and hi only in the open slots' names, never
        # a label of their own beside them.
        assert colour["ticks"][1:-1] == ["-0.75", "-0.25", "0", "0.5", "0.75"]
        assert "log2" not in opened.evaluate(
            "document.getElementById('colordim').layout.title.text"
        )
        bars = opened.evaluate("document.getElementById('distribution').data[0]")
        assert len(bars["x"]) == 10
        assert bars["x"][0] == pytest.approx(-1.1)  # the underflow band's middle
        assert bars["x"][5] == pytest.approx(0.125)  # the bin [0, 0.25)
        assert bars["text"][0] == "&lt; -1"  # escaped for Plotly's labels
        assert sum(bars["y"]) == pytest.approx(1.0)
        assert "NaN not counted" in opened.evaluate(
            "document.getElementById('distribution').layout.xaxis.title.text"
        )

    page.goto(pictures.url + "/#/run/linear")
    check(page)
    path = tmp_path / "linear.html"
    write_report(pictures_root / "linear", path)
    context, report, errors = open_report(browser, path)
    check(report)
    context.close()
    assert errors == []


def test_compared_runs_share_a_scale_and_match_layers_by_type(page, pictures):
    page.goto(pictures.url + "/#/run/dead")
    plotted(page, "heatmap")
    page.wait_for_selector("#compare-select")
    page.select_option("#compare-select", "tanh")
    plotted(page, "heatmap-compare")
    # The left heat map shrinks to its half at once, without a window resize.
    page.wait_for_function(
        "() => { const n = document.getElementById('heatmap');"
        " return n._fullLayout.width <= n.getBoundingClientRect().width + 1; }",
        timeout=WAIT_MS,
    )
    scales = page.evaluate(
        """() => ['heatmap', 'heatmap-compare'].map(id => {
            const trace = document.getElementById(id).data[0];
            const values = trace.z.flat().filter(v => v !== null);
            return { zmin: trace.zmin, zmax: trace.zmax, lo: Math.min(...values),
                     hi: Math.max(...values) };
        })"""
    )
    left, right = scales
    assert (left["zmin"], left["zmax"]) == (right["zmin"], right["zmax"])
    assert left["zmin"] == min(left["lo"], right["lo"])
    assert left["zmax"] == max(left["hi"], right["hi"])
    assert left["hi"] != right["hi"]  # the runs differ: one scale is a choice, not a given
    note = page.locator("#heatmap-unmatched").inner_text()
    assert "1 (ReLU)" in note
    assert "1 (Tanh)" in note
    assert "0 (Linear)" not in note
    assert "Tanh" in hover_cell(page, "heatmap-compare", 1, 1)

    def series_names(module: str) -> list[str]:
        page.wait_for_function(
            "module => document.getElementById('series').layout.uirevision === module + 'absmax'",
            arg=module,
            timeout=WAIT_MS,
        )
        return page.evaluate("document.getElementById('series').data.map(t => t.name)")

    # The first layer, shown when the run opens, is a Linear in both: overlaid.
    page.wait_for_function(
        "() => document.getElementById('series').data.some(t => t.name === 'tanh')",
        timeout=WAIT_MS,
    )
    click_cell(page, "heatmap", 1, 1)  # the ReLU: the compared run's "1" is a Tanh
    assert "tanh" not in series_names("1")
    assert page.locator("#layer-type").inner_text() == "ReLU"


def test_a_live_run_follows_its_latest_step_until_one_is_chosen(page, tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    with Server(root) as server, LiveTraining(root / "live") as training:
        page.goto(server.url + "/#/run/live")
        plotted(page, "heatmap")
        page.wait_for_function("() => document.body.dataset.step === '1'", timeout=WAIT_MS)
        training.next_round()
        page.wait_for_function("() => document.body.dataset.step === '3'", timeout=WAIT_MS)
        click_cell(page, "heatmap", 0, 2)
        page.wait_for_function("() => document.body.dataset.step === '2'", timeout=WAIT_MS)
        updates = int(page.evaluate("document.body.dataset.updates"))
        training.next_round()
        page.wait_for_function(
            "n => Number(document.body.dataset.updates) > n"
            " && document.getElementById('heatmap').dataset.columns === '6'",
            arg=updates,
            timeout=WAIT_MS,
        )
        assert page.evaluate("document.body.dataset.step") == "2"
        assert page.locator("#layer-step").inner_text() == "step 2"
        overhead = page.locator("#overhead").inner_text()
        assert "writer thread\tnot yet known" in overhead  # run.json has it at close only


def check_alerts(opened) -> None:
    opened.wait_for_selector(".alert-group")
    groups = opened.locator(".alert-summary").all_inner_texts()
    assert len(groups) == 3
    steps = "steps 0\u20135"  # with an en dash
    assert groups[0] == f"dead · warning · 72 alerts in 3 layers, {steps}"
    assert "exploding · warning · 36 alerts" in groups[1]
    assert "nonfinite · error · 10 alerts" in groups[2]
    assert opened.locator(".alert-row").count() == 118
    visible = opened.locator(".alert-row:visible").count()
    assert visible == 9  # the first 3 of each rule; the rest folded
    assert opened.locator("#alerts").bounding_box()["height"] < 900
    opened.locator(".more-alerts > summary").first.click()
    assert opened.locator(".alert-row:visible").count() == 9 + 69


def test_many_alerts_are_grouped_and_folded(page, pictures, pictures_root, browser, tmp_path):
    page.goto(pictures.url + "/#/run/alerts")
    check_alerts(page)
    path = tmp_path / "alerts.html"
    write_report(pictures_root / "alerts", path)
    context, report, errors = open_report(browser, path)
    check_alerts(report)
    context.close()
    assert errors == []
