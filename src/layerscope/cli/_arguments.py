"""Argument types the subcommands share: a bad value is argparse's one-line usage error.

argparse calls each on the text given and prints ``error: argument --top: ...`` with exit
status 2 for an ``ArgumentTypeError``, so no subcommand meets a value it cannot use.
"""

from __future__ import annotations

import argparse
import os
import re

#: The phases a run records, for ``--phase``.
PHASES = ("train", "eval")
#: How a run is named on every subcommand's line.
RUN_METAVAR = "RUN"


def count(text: str) -> int:
    """An integer >= 0 (``--top``, ``--alerts``: 0 means all).

    Examples:
        >>> count("3")
        3
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def regex(text: str) -> str:
    """A regular expression that compiles (``--modules``), kept as its text."""
    try:
        re.compile(text)
    except re.error as error:
        raise argparse.ArgumentTypeError(f"invalid regex {text!r}: {error}") from None
    return text


def new_file(text: str) -> str:
    """A file to write whose folder exists (``--output``)."""
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"no folder {folder} to write {text} into")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a folder: give a file name")
    return text
