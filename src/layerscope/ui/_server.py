"""Running the dashboard: uvicorn on one address, loopback unless the user says otherwise."""

from __future__ import annotations

import os
import sys

from layerscope._imports import require
from layerscope.ui._app import create_app, is_loopback


def serve(root: str | os.PathLike[str], *, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Serve the runs under ``root`` at ``http://host:port`` until interrupted."""
    uvicorn = require("uvicorn", "ui")
    app = create_app(root, host=host)
    if not is_loopback(host):
        print(
            f"warning: serving {os.fspath(root)} on {host}, reachable from other machines: "
            "anyone who can reach this address can read these runs (there is no login)",
            file=sys.stderr,
        )
    shown = f"[{host}]" if ":" in host else host
    print(f"layerscope: serving {os.fspath(root)} at http://{shown}:{port}/", file=sys.stderr)
    uvicorn.run(app, host=host, port=port, log_level="warning")
