"""A griffe extension for the API reference: layerscope's ``Example:`` sections as examples.

layerscope's docstrings head their runnable examples ``Example:`` (Google style, as Napoleon
reads it). griffe knows only ``Examples:`` as the section of ``>>>`` blocks and renders
``Example:`` as an admonition of Markdown, where ``>>>`` reads as nested quotes and a printed
list as a link. This renames the heading, and puts the indented block under an RST-style
``Example::`` into a fenced code block, so that both render as code. The sources stay as they
are; mkdocs loads this file through ``mkdocs.yml`` (it is excluded from the site).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_HEADING = re.compile(r"^(?P<indent>\s*)Example(?P<colons>::?)\s*$")


def rewrite(text: str) -> str:
    """``text`` with each ``Example:`` heading as ``Examples:`` and ``Example::`` fenced."""
    lines = text.splitlines()
    out: list[str] = []
    index = 0
    while index < len(lines):
        match = _HEADING.match(lines[index])
        if not match:
            out.append(lines[index])
            index += 1
            continue
        indent = match["indent"]
        if match["colons"] == ":":
            out.append(f"{indent}Examples:")
            index += 1
            continue
        # Example:: then an indented block: the block, fenced, under an "Example:" admonition.
        block: list[str] = []
        index += 1
        while index < len(lines) and (
            not lines[index].strip() or len(lines[index]) - len(lines[index].lstrip()) > len(indent)
        ):
            block.append(lines[index])
            index += 1
        while block and not block[-1].strip():
            block.pop()
        while block and not block[0].strip():
            block.pop(0)
        depth = min(len(line) - len(line.lstrip()) for line in block if line.strip())
        inner = indent + "    "
        out.append(f"{indent}Example:")
        out.append(f"{inner}```python")
        out.extend(inner + line[depth:] if line.strip() else "" for line in block)
        out.append(f"{inner}```")
        out.append("")
    return "\n".join(out)


class ExampleSections(griffe.Extension):
    """Rewrites the docstring of every object griffe loads, before it is parsed."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrite ``obj``'s docstring."""
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value)
