"""Running the dashboard: uvicorn on one address, loopback unless the user says otherwise."""

from __future__ import annotations

import os
import socket
import sys

from layerscope._imports import require
from layerscope.ui._app import create_app, is_loopback

# Seconds the server waits, once told to stop, for the answers still being made: a request
# waiting on a run's read that never ends must not keep it from stopping. Threads stuck in
# such a read are daemon threads: the process exits without them.
STOP_GRACE = 1


def serve(root: str | os.PathLike[str], *, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Serve the runs under ``root`` at ``http://host:port`` until interrupted.

    Raises:
        OSError: the address cannot be had (a port in use, say): nothing was printed.
    """
    uvicorn = require("uvicorn", "ui")
    app = create_app(root, host=host)
    # Bound before a word is printed: a taken port is an error, not "serving ..." then one.
    listening = bound_socket(host, port)
    if not is_loopback(host):
        print(
            f"warning: serving {os.fspath(root)} on {host}, reachable from other machines: "
            "anyone who can reach this address can read these runs (there is no login)",
            file=sys.stderr,
        )
    shown = f"[{host}]" if ":" in host else host
    port = listening.getsockname()[1]  # the one the system chose, for port 0
    print(f"layerscope: serving {os.fspath(root)} at http://{shown}:{port}/", file=sys.stderr)
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=STOP_GRACE
    )
    server = uvicorn.Server(config)
    with listening:
        server.run(sockets=[listening])


def bound_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port``, as uvicorn would bind it; OSError if it cannot."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listening = socket.socket(family, socket.SOCK_STREAM)
    try:
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listening.bind((host, port))
    except OSError:
        listening.close()
        raise
    return listening
