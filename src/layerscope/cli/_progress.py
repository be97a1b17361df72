"""Progress of a long command: a bar on a terminal's stderr, nothing in a pipe or a file.

``export``, ``report`` and ``plot`` of a long run (thousands of steps and layers) work for
seconds to minutes; on a terminal they say how far they are. The bar is transient: it is gone
when the work is done, and the command's output reads as it always did.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import TextIO

Advance = Callable[[], None]


def _on_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or a stand-in stream
        return False


@contextlib.contextmanager
def progress(
    what: str, total: int | None = None, stream: TextIO | None = None
) -> Iterator[Advance]:
    """A function that counts one piece of ``what`` done, out of ``total`` (None: unknown).

    On a terminal (``stream``, default stderr) a bar shows the count while the block runs.
    """
    stream = sys.stderr if stream is None else stream
    if not _on_terminal(stream):
        yield lambda: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    columns = (
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    console = Console(file=stream, force_terminal=True)
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(what, total=total)
        yield lambda: bar.advance(task)
