"""Where a command's output goes: rich tables on a terminal, plain aligned text elsewhere.

Commands build ``Table``s and field lists and hand them to an ``Output``; they never print
themselves, so the same command shows rich tables in a terminal and stable plain text in a
pipe, a file or a golden test. Either output shows every string through ``visible``: names and
messages from a run's files cannot drive the terminal. rich is imported only when it is used.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO

from layerscope.cli._visible import visible

_GAP = "  "  # between the columns of plain text


@dataclass(frozen=True, slots=True)
class Column:
    """A table column: its header, and whether it holds numbers (right-aligned)."""

    header: str
    numeric: bool = False


@dataclass(slots=True)
class Table:
    """A titled table of text cells; ``styles`` colour rows in rich and are ignored in plain."""

    title: str
    columns: Sequence[Column]
    rows: list[list[str]] = field(default_factory=list)
    styles: list[str | None] = field(default_factory=list)

    def add(self, cells: Sequence[str], style: str | None = None) -> None:
        """Append a row of as many cells as there are columns."""
        if len(cells) != len(self.columns):
            raise ValueError(f"a row of {len(cells)} cells in a table of {len(self.columns)}")
        self.rows.append(list(cells))
        self.styles.append(style)


class Output(Protocol):
    """What a command writes to: sections of fields, tables and lines."""

    def fields(self, title: str, pairs: Sequence[tuple[str, str]]) -> None:
        """A block of ``name  value`` lines under ``title`` (none if empty)."""

    def table(self, table: Table) -> None:
        """A table under its title."""

    def line(self, text: str, style: str | None = None) -> None:
        """One line of text, set apart from the sections around it."""


class PlainOutput:
    """Plain text, columns aligned with spaces, sections separated by a blank line.

    Examples:
        >>> import io
        >>> stream = io.StringIO()
        >>> table = Table("layers", [Column("module"), Column("std", numeric=True)])
        >>> table.add(["0", "0.5492"]); table.add(["classifier", "1.8"])
        >>> PlainOutput(stream).table(table)
        >>> print(stream.getvalue(), end="")
        layers
        module         std
        ----------  ------
        0           0.5492
        classifier     1.8
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._started = False

    def fields(self, title: str, pairs: Sequence[tuple[str, str]]) -> None:
        """A block of ``name  value`` lines, names padded to one width."""
        title, pairs = visible(title), _visible_pairs(pairs)
        width = max((len(name) for name, _ in pairs), default=0)
        lines = [f"{name.ljust(width)}{_GAP}{value}".rstrip() for name, value in pairs]
        self._section([title, *lines] if title else lines)

    def table(self, table: Table) -> None:
        """The title, the headers, a rule of dashes, then the rows."""
        table = _visible_table(table)
        widths = _widths(table)

        def aligned(cells: Sequence[str]) -> str:
            padded = [
                cell.rjust(width) if column.numeric else cell.ljust(width)
                for cell, width, column in zip(cells, widths, table.columns, strict=True)
            ]
            return _GAP.join(padded).rstrip()

        rule = _GAP.join("-" * width for width in widths)
        body = [aligned(row) for row in table.rows]
        headers = aligned([column.header for column in table.columns])
        self._section([table.title, headers, rule, *body])

    def line(self, text: str, style: str | None = None) -> None:
        """The text, control characters made visible."""
        self._section([visible(text)])

    def _section(self, lines: Sequence[str]) -> None:
        if self._started:
            self._stream.write("\n")
        self._started = True
        self._stream.write("".join(f"{line}\n" for line in lines))


class RichOutput:
    """rich tables and colours, for a terminal.

    Text from the run (names, messages) is shown as ``Text``, never read as rich markup, and
    its control characters made visible.
    """

    def __init__(self) -> None:
        from rich.console import Console

        self._console = Console(highlight=False)
        self._started = False

    def fields(self, title: str, pairs: Sequence[tuple[str, str]]) -> None:
        """A two-column grid of dim names and values."""
        from rich.table import Table as RichTable
        from rich.text import Text

        grid = RichTable.grid(padding=(0, 2))
        grid.add_column(style="dim")
        grid.add_column()
        for name, value in _visible_pairs(pairs):
            grid.add_row(Text(name), Text(value))
        self._print(Text(visible(title), style="bold") if title else None, grid)

    def table(self, table: Table) -> None:
        """A rich table with a simple rule under the headers."""
        from rich import box
        from rich.table import Table as RichTable
        from rich.text import Text

        table = _visible_table(table)
        shown = RichTable(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False, show_edge=False)
        # Numbers are right-aligned here, not by rich, which trims the trailing spaces that
        # line up what follows a number in a column (the summary's trends).
        widths = _widths(table)
        for column, width in zip(table.columns, widths, strict=True):
            shown.add_column(Text(column.header.rjust(width) if column.numeric else column.header))
        for row, style in zip(table.rows, table.styles, strict=True):
            cells = [
                Text(cell.rjust(width) if column.numeric else cell)
                for cell, width, column in zip(row, widths, table.columns, strict=True)
            ]
            shown.add_row(*cells, style=style)
        self._print(Text(table.title, style="bold"), shown)

    def line(self, text: str, style: str | None = None) -> None:
        """The text, in ``style`` if given."""
        from rich.text import Text

        self._print(Text(visible(text), style=style or ""))

    def _print(self, *renderables: Any) -> None:
        if self._started:
            self._console.print()
        self._started = True
        for renderable in renderables:
            if renderable is not None:
                self._console.print(renderable)


def _visible_table(table: Table) -> Table:
    """``table`` with its title, headers and cells made visible (see ``visible``)."""
    return Table(
        visible(table.title),
        [Column(visible(column.header), column.numeric) for column in table.columns],
        [[visible(cell) for cell in row] for row in table.rows],
        list(table.styles),
    )


def _visible_pairs(pairs: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(visible(name), visible(value)) for name, value in pairs]


def _widths(table: Table) -> list[int]:
    """The width of each column: its widest cell or header."""
    widths = [len(column.header) for column in table.columns]
    for row in table.rows:
        widths = [max(width, len(cell)) for width, cell in zip(widths, row, strict=True)]
    return widths


def open_output(plain: bool) -> Output:
    """Rich output on a terminal where rich is installed; plain text otherwise or if asked."""
    if plain or not sys.stdout.isatty():
        return PlainOutput(sys.stdout)
    try:
        import rich  # noqa: F401  # only whether it is installed
    except ImportError:
        return PlainOutput(sys.stdout)
    return RichOutput()
