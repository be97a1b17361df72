"""Driving the page in a real headless Chromium: where it is, how to wait for a chart, how
to click and hover a heat map's cell as a user would. The ``browser`` and ``page`` fixtures
are in conftest.py."""

from __future__ import annotations

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
WAIT_MS = 15_000


def plotted(page, element_id: str) -> None:
    """Wait until Plotly has drawn into ``element_id`` with at least one trace of data."""
    page.wait_for_function(
        "id => { const n = document.getElementById(id);"
        " return n && n.data && n.data.length > 0 && n.querySelector('.main-svg'); }",
        arg=element_id,
        timeout=WAIT_MS,
    )


def click_cell(page, element_id: str, row: int, x: float) -> None:
    """Click the heat map cell of row ``row`` (0 = top) at step ``x``, as a user would."""
    where = cell_position(page, element_id, row, x)
    page.wait_for_timeout(300)  # let a relayout in flight (the step marker) settle
    where = cell_position(page, element_id, row, x)
    page.mouse.click(where[0], where[1])


def hover_cell(page, element_id: str, row: int, x: float) -> str:
    """The hover label of the heat map cell of row ``row`` at step ``x``."""
    where = cell_position(page, element_id, row, x)
    page.mouse.move(where[0], where[1])
    label = page.locator(f"#{element_id} .hoverlayer .hovertext")
    label.first.wait_for(timeout=WAIT_MS)
    return str(label.first.text_content())


def cell_position(page, element_id: str, row: int, x: float) -> list[float]:
    """Where on the page the heat map cell of row ``row`` (0 = top) at step ``x`` is."""
    page.wait_for_function(
        "id => document.getElementById(id).dataset.bound === '1'", arg=element_id
    )
    return page.evaluate(
        """([id, row, x]) => {
            const node = document.getElementById(id);
            const xa = node._fullLayout.xaxis, ya = node._fullLayout.yaxis;
            const box = node.querySelector('.nsewdrag').getBoundingClientRect();
            return [box.left + xa.l2p(x), box.top + ya.l2p(row)];
        }""",
        [element_id, row, x],
    )
