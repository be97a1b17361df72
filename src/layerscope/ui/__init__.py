"""The dashboard (``layerscope serve``) and the self-contained HTML report (``layerscope report``).

Both draw the same page from the same JSON: the dashboard asks a local, read-only server for
it while runs are written; the report carries it inside one HTML file that opens offline.
starlette, uvicorn and plotly (``pip install 'layerscope[ui]'``) are imported when used.

Example::

    layerscope.ui.serve("runs")                       # http://127.0.0.1:8765
    layerscope.ui.write_report("runs/exp1", "exp1.html")
"""

from __future__ import annotations

import os

from layerscope.ui._report import report_html

__all__ = ["report_html", "serve", "write_report"]


def serve(
    root: str | os.PathLike[str] = "runs", *, host: str = "127.0.0.1", port: int = 8765
) -> None:
    """Serve the dashboard of the runs under ``root`` until interrupted.

    It binds ``127.0.0.1`` unless told otherwise, and warns on stderr when it binds an
    address that other machines can reach.
    """
    from layerscope.ui._server import serve as run_server

    run_server(root, host=host, port=port)


def write_report(
    run: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    compare: str | os.PathLike[str] | None = None,
) -> int:
    """Write the HTML report of ``run`` (beside ``compare``, if given); return its size in bytes."""
    from layerscope.ui._report import write_report as write

    return write(run, output, compare=compare)
