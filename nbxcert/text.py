"""Text as nbxcert prints it: a name, key or path from outside shown with its control characters escaped."""

from __future__ import annotations

from typing import Any


def printable(text: Any) -> str:
    """`text` with control characters escaped, so a hostile name cannot drive the terminal."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)
