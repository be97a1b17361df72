"""The self-contained HTML report: the dashboard's page with its answers embedded.

The report holds, under the same keys the page asks the server for, every answer its views
can ask for: the summary, modules, scalars and alerts of each rank, the heat map of every
kind, tensor, statistic and phase, each layer's series and histogram over steps, and the
attention heads by steps of each phase (none where the run recorded no attention). Each
layer's distribution at a step is the column of its histogram over steps that holds the step.
Plotly's script, the page's script and style and the data are inlined, and a
Content-Security-Policy lets the file load nothing from anywhere: it opens offline.

Charts over steps have at most ``REPORT_COLUMNS`` columns, so a run of 200 layers by 10,000
steps makes a report of tens of MB, not gigabytes.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote as url_quote

from layerscope.store import Run, load
from layerscope.ui import _assets, _attention, _distributions, _heatmap, _overview
from layerscope.ui._query import Selection, bucket_width

REPORT_COLUMNS = 200
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data:; font-src data:; base-uri 'none'; form-action 'none'"
)


def api_key(path: str, params: dict[str, Any] | None = None) -> str:
    """The URL the page asks for: ``api/PATH?k=v&...``, keys sorted, as ``apiPath`` in app.js.

    Example:
        >>> api_key("runs/a b/heatmap", {"stat": "std", "kind": "grad"})
        'api/runs/a b/heatmap?kind=grad&stat=std'
    """
    query = "&".join(
        f"{_component(key)}={_component(str(value))}"
        for key, value in sorted((params or {}).items())
        if value is not None
    )
    return f"api/{path}" + (f"?{query}" if query else "")


def _component(text: str) -> str:
    """``text`` as JavaScript's ``encodeURIComponent`` writes it."""
    return url_quote(text, safe="-_.!~*'()")


def run_path(run_id: str, rest: str = "") -> str:
    """``runs/ID[/rest]``, the id written as the page writes it."""
    return f"runs/{_component(run_id)}" + (f"/{rest}" if rest else "")


def answers(run: Run, run_id: str, *, layers: bool = True) -> Iterator[tuple[str, Any]]:
    """Every (key, answer) the page can ask of ``run``.

    ``layers`` False leaves out the layers' histograms (a compared run's series stay, for the
    overlays).
    """
    summary = _overview.summary(run, run_id)
    yield api_key(run_path(run_id)), summary
    yield api_key(run_path(run_id, "modules")), {"modules": _overview.modules(run)}
    width = bucket_width(run, summary["steps"], REPORT_COLUMNS)
    for rank in summary["ranks"]:
        yield api_key(run_path(run_id, "scalars"), {"rank": rank}), _overview.scalars(run, rank)
        yield api_key(run_path(run_id, "alerts"), {"rank": rank}), _overview.alerts(run, rank)
        for phase in summary["phases"]:
            heads = _attention.attention(run, phase, rank, width)
            yield api_key(run_path(run_id, "attention"), {"phase": phase, "rank": rank}), heads
            for kind, tensors in summary["kinds"].items():
                for tensor in tensors:
                    selection = Selection.checked(kind, tensor, phase, rank)
                    yield from _charts(run, run_id, selection, summary, width, layers)


def _charts(
    run: Run, run_id: str, selection: Selection, summary: dict[str, Any], width: int, layers: bool
) -> Iterator[tuple[str, Any]]:
    """The heat maps, series and histograms of one kind, tensor, phase and rank."""
    params = {
        "kind": selection.kind,
        "tensor": selection.tensor,
        "phase": selection.phase,
        "rank": selection.rank,
    }
    for stat in summary["stats"]:
        answer = _heatmap.heatmap(run, selection, stat, width)
        yield api_key(run_path(run_id, "heatmap"), {**params, "stat": stat}), answer
    for module, answer in _heatmap.series_of_layers(run, selection, None, width).items():
        yield api_key(run_path(run_id, "series"), {**params, "module": module}), answer
    if layers and summary["histograms"]:
        for module, answer in _distributions.color_dims(run, selection, None, width).items():
            yield api_key(run_path(run_id, "colordim"), {**params, "module": module}), answer


def report_html(
    run: Run, *, compare: Run | None = None, answered: Callable[[], None] | None = None
) -> str:
    """The report's HTML text; ``answered`` is called as each of its answers is made."""
    run_id = Path(run.path).name or "run"
    compare_id = None if compare is None else Path(compare.path).name or "compare"
    if compare_id == run_id:
        compare_id = f"{compare_id} (compared)"
    made = answers(run, run_id)
    if compare is not None and compare_id is not None:
        made = itertools.chain(made, answers(compare, compare_id, layers=False))
    responses = {}
    for key, answer in made:
        responses[key] = answer
        if answered is not None:
            answered()
    listed = [_listed(run, run_id)]
    if compare is not None and compare_id is not None:
        listed.append(_listed(compare, compare_id))
    responses[api_key("runs")] = {"root": "", "runs": listed}
    embedded = _embedded_json({"run": run_id, "compare": compare_id, "responses": responses})
    plotly = _assets.plotly_path().read_text(encoding="utf-8")
    head = "\n".join(
        [
            f'<meta http-equiv="Content-Security-Policy" content="{CONTENT_SECURITY_POLICY}">',
            f"<style>\n{_assets.text('style.css')}\n</style>",
            f"<script>\n{_inline(plotly)}\n</script>",
            f'<script type="application/json" id="layerscope-data">{embedded}</script>',
            *(f"<script>\n{_inline(_assets.text(name))}\n</script>" for name in _assets.SCRIPTS),
        ]
    )
    page = _assets.text("index.html").replace("<!--assets-->", head)
    return page.replace("<title>layerscope</title>", f"<title>layerscope: {_html(run_id)}</title>")


def _listed(run: Run, run_id: str) -> dict[str, Any]:
    meta = run.meta
    return {
        "id": run_id,
        "name": meta.get("name"),
        "status": meta.get("status"),
        "steps": meta.get("steps"),
        "ranks": len(meta.get("ranks", ())),
        "started": meta.get("started"),
        "ended": meta.get("ended"),
        "alerts": len(run.alerts),
    }


def _embedded_json(data: Any) -> str:
    """JSON that cannot end its <script> element nor open a comment: <, >, & escaped."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    for character, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(character, escaped)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _inline(script: str) -> str:
    """A script's text made safe inside <script>: no ``</script`` can end it early."""
    return script.replace("</script", "<\\/script").replace("<!--", "<\\!--")


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def write_report(
    run: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    compare: str | os.PathLike[str] | None = None,
) -> int:
    """Write the report of the run at ``run`` (beside the one at ``compare``) to ``output``.

    Returns:
        The size of the file written, in bytes.
    """
    html = report_html(load(run), compare=None if compare is None else load(compare))
    encoded = html.encode("utf-8")
    Path(output).write_bytes(encoded)
    return len(encoded)
