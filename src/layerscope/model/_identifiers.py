"""Names in SQL text: every table, view and column a reader's query names goes through here.

A name comes into a query's text from a fixed list in the code (tables, key columns, the
statistics a command shows, the formats' counts), or from the run's declared schema once it
was checked (run.json's ``config.stats`` and ``config.custom_stats``, which a reader accepts
only as built-in statistics and ``is_custom_stat_name`` identifiers). A column a file holds
that nothing declares is never named: values are bound as parameters, names come from here.
"""

from __future__ import annotations


def quote_identifier(name: str) -> str:
    """``name`` as one SQL identifier: in double quotes, an embedded double quote doubled.

    Args:
        name: a table, view or column name; not empty, and without control characters
            (no name the code declares holds one, so one here is a name from elsewhere).

    Raises:
        TypeError: ``name`` is not a string.
        ValueError: ``name`` is empty or holds a control character.

    Examples:
        >>> print(quote_identifier("absmax"), quote_identifier('a"b'))
        "absmax" "a""b"
    """
    if not isinstance(name, str):
        raise TypeError(f"name: expected a string, got {type(name).__name__}")
    if not name or any(ord(char) < 32 or ord(char) == 127 for char in name):
        raise ValueError(f"name: expected a name without control characters, got {name!r}")
    return '"' + name.replace('"', '""') + '"'
