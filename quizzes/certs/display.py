"""Showing text that a credential's author chose (issuer name, narrative, reasons) on a terminal, safely.

Anyone can write a credential file, so every string `verify` prints from one is attacker-controlled. A raw ESC
starts an ANSI sequence that can move the cursor, erase the line or recolour it, and so hide the real issuer did
behind a fake one; a bidi override (U+202E) reorders what follows on screen; a newline forges a second output
line. `shown` writes every such character as a visible escape (\\x1b, \\u202e), so what the reader sees is what
the file holds, and it cuts the text to a length first, so its cost is linear and bounded whatever the input.
"""

from __future__ import annotations

import unicodedata

# Unicode categories that are invisible or act on the display: controls (Cc: C0, DEL, C1), format characters
# (Cf: bidi embeddings, overrides and isolates, zero-width joiners, the BOM, soft hyphen), line and paragraph
# separators (Zl, Zp), surrogates (Cs), private use (Co) and unassigned code points (Cn).
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})
ELLIPSIS = "…"


def _escape_char(c: str) -> str:
    code = ord(c)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def shown(text: object, limit: int = 200, *, keep_backslash: bool = False) -> str:
    """`text` as printable, one-line text: unsafe characters escaped, the backslash doubled (so an escape in the
    output always means an escaped character, never one the author typed), and cut to `limit` source characters
    with an ellipsis. Runs in O(limit) whatever len(text) is. `keep_backslash` leaves a typed backslash single
    (a person's name on a printed certificate: `$\\bad$` stays as typed)."""
    if not isinstance(text, str):
        text = repr(text)
    cut = len(text) > limit
    head = text[:limit]
    out = []
    for c in head:
        if c == "\\" and not keep_backslash:
            out.append("\\\\")
        elif unicodedata.category(c) in _UNSAFE_CATEGORIES:
            out.append(_escape_char(c))
        else:
            out.append(c)
    return "".join(out) + (ELLIPSIS if cut else "")
