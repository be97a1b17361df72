"""``layerscope serve [DIR]``: the live dashboard of the runs under a folder, on this machine."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from layerscope.cli._open import CommandError

if TYPE_CHECKING:
    from layerscope.cli._command import Subparsers


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add ``serve``'s parser."""
    parser = subparsers.add_parser(
        "serve",
        help="the live dashboard of the runs under a folder",
        description="Serve a read-only dashboard of the runs directly under DIR: their "
        "scalars, layers-by-steps heat maps, histograms, alerts and module trees, updated "
        "while runs are written. It listens on 127.0.0.1 (this machine only) unless --host "
        "says otherwise. Needs: pip install 'layerscope[ui]'.",
    )
    parser.add_argument(
        "dir", nargs="?", default="runs", metavar="DIR", help="the folder (default: runs)"
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on (default: 127.0.0.1; 0.0.0.0 lets any machine read)",
    )
    parser.add_argument("--port", type=int, default=8765, help="the port (default: 8765)")
    return parser


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted (Ctrl-C)."""
    from layerscope import ui  # starlette and uvicorn: the ui extra, imported when it serves

    if not os.path.isdir(args.dir):
        raise CommandError(f"no folder at {args.dir}")
    if os.path.exists(os.path.join(args.dir, "run.json")):
        parent = os.path.dirname(os.path.abspath(args.dir))
        raise CommandError(f"{args.dir} is a run: serve the folder that holds it ({parent})")
    if not 0 <= args.port <= 65535:
        raise CommandError(f"--port: expected 0 to 65535, got {args.port}")
    try:
        ui.serve(args.dir, host=args.host, port=args.port)
    except OSError as error:  # the address: in use, or not this machine's
        reason = error.strerror or str(error)
        raise CommandError(f"cannot listen on {args.host}:{args.port}: {reason}") from None
    return 0
