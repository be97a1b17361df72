"""Text from a run made safe for a terminal: control characters shown as escapes.

A run's name, path, host, module and tensor names, alert messages and the reasons a file
was left out all come from files anyone may have written. Printed raw, an ESC sequence in
one of them could clear the screen, hide text, retitle the window or plant a hyperlink; a
bidi override could make a name read as another. Every string the command prints goes
through ``visible`` first, so such characters show as the escapes that name them.
"""

from __future__ import annotations

# Characters that move, colour or reorder what a terminal shows: C0 controls (tab and newline
# too: one name is one line), DEL, C1 controls (U+009B is a CSI of its own), the line and
# paragraph separators, and the bidi embeddings, overrides and isolates.
_C0_AND_DEL = [*range(0x00, 0x20), 0x7F]
_C1 = list(range(0x80, 0xA0))
_SEPARATORS = [0x2028, 0x2029]
_BIDI = [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_SHORT = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}


def _escape(code: int) -> str:
    if code in _SHORT:
        return _SHORT[code]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_ESCAPES = {code: _escape(code) for code in (*_C0_AND_DEL, *_C1, *_SEPARATORS, *_BIDI)}


def visible(text: str) -> str:
    r"""``text`` with every control character shown as its escape.

    Examples:
        >>> print(visible("fc1"))
        fc1
        >>> print(visible("\x1b[2Jrun\tone\x9b\u202e"))
        \x1b[2Jrun\tone\x9b\u202e
    """
    return text.translate(_ESCAPES)
