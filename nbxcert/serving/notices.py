"""Serving's notices: each one a line on stderr, said once per process (until serving's state is reset).

The profile in force, a certification served although made elsewhere, a key swept at run time: a process that
launches it a million times hears of it once. Imports nothing of nbxcert.
"""

from __future__ import annotations

import sys

_said: set[str] = set()


def say_once(text: str) -> None:
    """Print `text` to stderr unless this process has said it already."""
    if text not in _said:
        _said.add(text)
        print(text, file=sys.stderr)


def forget() -> None:
    """Say every notice again the next time it applies (`nbxcert.serving.reset`)."""
    _said.clear()
