"""The page's files: its HTML, script and style (package data), and Plotly's bundled script.

Nothing is fetched from the internet: Plotly's ``plotly.min.js`` comes from the installed
``plotly`` package, which the ``ui`` extra installs.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from layerscope._imports import require

# The page's scripts, in the order they run: each adds to ``window.layerscope``.
SCRIPTS = ("base.js", "figures.js", "panels.js", "app.js")
_OWN = (*SCRIPTS, "style.css")
PLOTLY = "plotly.min.js"


def _own(name: str) -> Path:
    return Path(str(resources.files("layerscope.ui") / "static" / name))


def plotly_path() -> Path:
    """Where the installed plotly package keeps its bundled ``plotly.min.js``."""
    plotly = require("plotly", "ui")
    path = Path(str(plotly.__file__)).parent / "package_data" / PLOTLY
    if not path.is_file():
        raise ImportError(
            f"plotly is installed without {PLOTLY}; reinstall it with: "
            "pip install --force-reinstall 'layerscope[ui]'"
        )
    return path


def plotly_version() -> str:
    """The installed plotly's version."""
    return str(require("plotly", "ui").__version__)


def static_path(name: str) -> Path | None:
    """The file a ``/static/NAME`` request may get, or None: only the page's own files."""
    if name in _OWN:
        return _own(name)
    if name == PLOTLY:
        return plotly_path()
    return None


def text(name: str) -> str:
    """The text of one of the page's files (``app.js``, ``style.css``, ``index.html``)."""
    return _own(name).read_text(encoding="utf-8")


def page() -> str:
    """The dashboard's HTML page, its scripts and style linked from ``/static/``."""
    # Both deferred, the page's own first: it asks for its data while Plotly is parsed.
    # Plotly's URL names its version, so the browser may keep it (and its compiled code).
    head = (
        '<link rel="stylesheet" href="static/style.css">\n'
        + "".join(f'<script src="static/{name}" defer></script>\n' for name in SCRIPTS)
        + f'<script src="static/{PLOTLY}?v={plotly_version()}" defer></script>'
    )
    return text("index.html").replace("<!--assets-->", head)
