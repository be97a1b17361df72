"""What a subcommand's module provides, for ``main`` to build the parser and dispatch."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from typing import TypeAlias

    # What ``ArgumentParser.add_subparsers()`` returns. argparse names the class privately,
    # and only typeshed makes it generic: the alias exists for the type checker alone.
    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]


class Subcommand(Protocol):
    """A subcommand's module: it adds its parser, and runs with the parsed arguments."""

    def add_parser(self, subparsers: Subparsers) -> argparse.ArgumentParser:
        """Add the subcommand's parser to ``subparsers`` and return it."""

    def run(self, args: argparse.Namespace) -> int:
        """Do the work, write the output, return the exit status."""
