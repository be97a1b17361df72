"""Names as a figure draws them: short, on one line, never read as mathtext.

Module, tensor and scalar names come from the run's files and have no length limit: matplotlib
lays out and measures every character of a label, so a name of 100 KB took minutes to draw.
A label keeps the first and last ``LABEL_ENDS`` characters of a longer name around an
ellipsis: two long names that differ at either end stay apart (``blocks.0 … .attn.q`` and
``blocks.0 … .attn.k``). The frames a figure is read from keep the whole names.
"""

from __future__ import annotations

import re

#: Characters kept at each end of a name longer than twice this and one.
LABEL_ENDS = 30
_ELLIPSIS = "…"
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def drawn_name(name: str) -> str:
    r"""``name`` as a label, title or legend draws it: shortened, one line, ``$`` literal.

    Examples:
        >>> drawn_name("encoder.2")
        'encoder.2'
        >>> drawn_name("a" * 50 + "b" * 50)
        'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa…bbbbbbbbbbbbbbbbbbbbbbbbbbbbbb'
        >>> print(drawn_name("cost $x$\n"))
        cost \$x\$\x0a
    """
    if len(name) > 2 * LABEL_ENDS + 1:
        name = name[:LABEL_ENDS] + _ELLIPSIS + name[-LABEL_ENDS:]
    # A newline would make a label of many lines; an even number of "$" a formula, which
    # mathtext parses (and may reject, failing the whole figure): both drawn as written.
    name = _CONTROL.sub(lambda match: f"\\x{ord(match[0]):02x}", name)
    return name.replace("$", r"\$")
