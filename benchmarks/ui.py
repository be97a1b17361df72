"""The dashboard on a large run: how fast a run opens and how fast the heat map answers.

    python benchmarks/ui.py            # prints the figures
    python benchmarks/ui.py --write    # also updates the Dashboard section of BENCHMARKS.md

A synthetic run of 200 layers by 10,000 recorded steps (8 million rows of statistics with
log2 histograms, ``synthetic.write_run``) is served by the real app under uvicorn on
127.0.0.1, and read over HTTP as the page reads it:

- cold open: a fresh server, then what the page asks for when a run opens: the page and its
  scripts, the run's summary, then its scalars, alerts, modules and the heat map at once (the
  browser's parallel requests), until the last answer is in; median of fresh servers;
- first layer: the series, histogram over steps and distribution of the layer the page
  selects, asked at once, right after;
- heat map: one request for a heat map of another statistic (11 statistics, each kind),
  median over all;
- in Chromium (where Playwright and /usr/bin/chromium are there): from navigation until the
  heat map is drawn;
- report (``--report``): the time and size of ``layerscope report`` of the run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests" / "ui"))

from ui_runs import Server

from report import command, machine, replace_section
from synthetic import write_run

CHROMIUM = "/usr/bin/chromium"
KINDS = ("activation", "grad", "weight", "weight_grad")
STATS = (
    "mean", "std", "min", "max", "absmax", "l2", "zero_frac", "neg_frac", "pos_frac",
    "nan_count", "inf_count",
)  # fmt: skip


def fetch(base: str, path: str) -> int:
    with urllib.request.urlopen(base + path, timeout=60) as response:
        return len(response.read())


def timed(function, *args) -> float:
    start = time.perf_counter()
    function(*args)
    return time.perf_counter() - start


def fetch_all(base: str, paths: list[str]) -> None:
    """Fetch ``paths`` at once, as a browser does, until the last is in."""
    with ThreadPoolExecutor(len(paths)) as pool:
        list(pool.map(lambda path: fetch(base, path), paths))


def open_run(base: str, run: str) -> None:
    fetch_all(base, ["/", "/static/app.js", "/static/style.css", "/static/plotly.min.js"])
    fetch(base, f"/api/runs/{run}")
    fetch_all(
        base,
        [
            f"/api/runs/{run}/scalars?rank=0",
            f"/api/runs/{run}/alerts?rank=0",
            f"/api/runs/{run}/modules",
            f"/api/runs/{run}/heatmap?kind=activation&phase=train&rank=0&stat=absmax&tensor=out",
        ],
    )


def first_layer(base: str, run: str, module: str) -> None:
    chart = f"kind=activation&module={module}&phase=train&rank=0&tensor=out"
    fetch_all(
        base,
        [
            f"/api/runs/{run}/series?{chart}",
            f"/api/runs/{run}/colordim?{chart}",
            f"/api/runs/{run}/distribution?{chart}&step=9999",
        ],
    )


def browser_open(base: str, run: str, repeats: int) -> tuple[float, float] | None:
    """Seconds from navigation until Plotly has drawn the heat map, in Chromium.

    The first page of a fresh browser, and the median of the next ``repeats`` pages, which
    find Plotly's script (and V8's compiled code of it) in the browser's cache.
    """
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if not os.path.exists(CHROMIUM):
        return None
    args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
    times = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=args)
        context = browser.new_context(viewport={"width": 1400, "height": 1000})  # one cache
        for _ in range(repeats + 1):
            page = context.new_page()
            start = time.perf_counter()
            page.goto(f"{base}/#/run/{run}")
            page.wait_for_function(
                "() => { const n = document.getElementById('heatmap');"
                " return n && n.data && n.data.length && n.querySelector('.main-svg'); }",
                timeout=60_000,
            )
            times.append(time.perf_counter() - start)
            page.close()
        browser.close()
    return times[0], statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=200)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument(
        "--runs", help="a folder for the run 'big': written there if missing, reused if there"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--report", action="store_true", help="also time the HTML report")
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.runs) if args.runs else Path(tmp)
        if not (root / "big" / "run.json").exists():
            begin = time.perf_counter()
            write_run(root / "big", layers=args.layers, steps=args.steps)
            print(f"wrote the run in {time.perf_counter() - begin:.1f} s", file=sys.stderr)
        load_before = os.getloadavg()[0]
        opens, layers = [], []
        for _ in range(args.repeats):
            with Server(root) as server:  # fresh: no DuckDB database open yet
                opens.append(timed(open_run, server.url, "big"))
                layers.append(timed(first_layer, server.url, "big", "layers.0"))
        with Server(root) as server:
            open_run(server.url, "big")
            heatmaps = [
                timed(
                    fetch,
                    server.url,
                    f"/api/runs/big/heatmap?kind={kind}&phase=train&rank=0&stat={stat}",
                )
                for kind in KINDS
                for stat in STATS
            ]
            in_browser = browser_open(server.url, "big", args.repeats)
        report_seconds = report_size = None
        if args.report:
            from layerscope.ui._report import write_report

            begin = time.perf_counter()
            report_size = write_report(root / "big", Path(tmp) / "big.html")
            report_seconds = time.perf_counter() - begin
    rows = [
        f"| cold open: page, summary, scalars, alerts, modules, heat map; median of "
        f"{args.repeats} fresh servers | {statistics.median(opens) * 1e3:.0f} ms |",
        f"| first layer: series, histogram over steps, distribution at once; median "
        f"| {statistics.median(layers) * 1e3:.0f} ms |",
        f"| heat map of another statistic (1,000 columns of 10 steps): median of "
        f"{len(heatmaps)} (min {min(heatmaps) * 1e3:.0f}, max {max(heatmaps) * 1e3:.0f}) "
        f"| {statistics.median(heatmaps) * 1e3:.0f} ms |",
    ]
    if in_browser is not None:
        first, later = in_browser
        rows.append(
            "| in Chromium: navigation until the heat map is drawn, a fresh browser "
            f"| {first * 1e3:.0f} ms |"
        )
        rows.append(
            f"| in Chromium: the same, Plotly's script cached; median of {args.repeats} "
            f"| {later * 1e3:.0f} ms |"
        )
    if report_seconds is not None and report_size is not None:
        rows.append(
            f"| `layerscope report` of the run: time, size | {report_seconds:.1f} s, "
            f"{report_size / 1e6:.0f} MB |"
        )
    text = "\n".join(
        [
            f"A synthetic run of {args.layers} layers by {args.steps:,} recorded steps "
            f"({args.layers * args.steps * 4 / 1e6:.0f} million rows with log2 histograms), "
            "served on 127.0.0.1 by the real app and read over HTTP. Each heat map is asked "
            "for once: none comes from the server's cache of recent answers. In Chromium, "
            "Plotly's 4.8 MB script alone takes about 1.1 s to load and run on this machine; "
            "the page asks for its data meanwhile. Load average before the measures (other "
            f"work on the machine): {load_before:.1f}.",
            "",
            "| measure | figure |",
            "|---|---|",
            *rows,
        ]
    )
    print(text)
    if args.write:
        body = f"Command: `{command('ui.py')}`; {machine(os.cpu_count() or 1)}.\n\n{text}"
        replace_section("Dashboard", body)


if __name__ == "__main__":
    main()
