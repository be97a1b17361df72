"""The compact table a notebook shows for a run, a scope or a capture (``_repr_html_``).

Every value is escaped: a run's name and path come from its files.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from html import escape
from typing import Any

_SEVERITIES = ("error", "warning", "info")
_CELL = "text-align: left; padding: 1px 8px 1px 0"


def html_table(title: str, fields: Sequence[tuple[str, object]]) -> str:
    r"""A two-column table of ``fields`` under ``title``.

    Examples:
        >>> print(html_table("run <a>", [("steps", 3)]).replace("><", ">\n<"))
        <table>
        <caption style="text-align: left">
        <b>run &lt;a&gt;</b>
        </caption>
        <tr>
        <th style="text-align: left; padding: 1px 8px 1px 0">steps</th>
        <td style="text-align: left; padding: 1px 8px 1px 0">3</td>
        </tr>
        </table>
    """
    rows = "".join(
        f'<tr><th style="{_CELL}">{escape(name)}</th>'
        f'<td style="{_CELL}">{escape(str(value))}</td></tr>'
        for name, value in fields
    )
    caption = f'<caption style="text-align: left"><b>{escape(title)}</b></caption>'
    return f"<table>{caption}{rows}</table>"


def alert_counts(severities: Iterable[str]) -> str:
    """``"3 (1 error, 2 warning)"``, or ``"none"``.

    Examples:
        >>> alert_counts(["warning", "error", "warning"]), alert_counts([])
        ('3 (1 error, 2 warning)', 'none')
    """
    counts = Counter(severities)
    total = sum(counts.values())
    if not total:
        return "none"
    parts = ", ".join(f"{counts[name]} {name}" for name in _SEVERITIES if counts[name])
    return f"{total} ({parts})"


def unreadable(error: Exception) -> str:
    """What a field shows when reading it failed: the table never raises."""
    first = (str(error).splitlines() or [""])[0][:120]
    return f"unreadable: {type(error).__name__}" + (f": {first}" if first else "")


def run_table(
    meta: Mapping[str, Any],
    path: str,
    modules: Callable[[], Iterable[Any]],
    alerts: Callable[[], Any],
) -> str:
    """A stored run's table: status, path, steps, ranks, layers watched and alerts.

    ``modules`` and ``alerts`` read the run's module tree and alerts table when called; a read
    that fails shows as unreadable.
    """
    last = meta.get("stats_last_step")
    recorded = f" (recorded up to step {last})" if last is not None else ""
    fields: list[tuple[str, object]] = [
        ("status", meta.get("status")),
        ("path", path),
        ("steps", f"{meta.get('steps')}{recorded}"),
    ]
    ranks = len(meta.get("ranks") or ())
    if ranks > 1:
        fields.append(("ranks", ranks))
    try:
        fields.append(("layers watched", sum(bool(info.watched) for info in modules())))
    except Exception as error:  # a view never raises
        fields.append(("layers watched", unreadable(error)))
    try:
        fields.append(("alerts", alert_counts(alerts()["severity"])))
    except Exception as error:
        fields.append(("alerts", unreadable(error)))
    return html_table(f"layerscope run {meta.get('name')}", fields)
