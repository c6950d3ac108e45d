"""What the command-line tests share: judging a finished `nbxcert` run."""

from __future__ import annotations

import subprocess


def check(r: subprocess.CompletedProcess, code: int, must=(), must_not=()) -> str:
    """Assert the exit code, no traceback, the lines that must appear and the ones that must not; return the text."""
    text = r.stdout + r.stderr
    assert r.returncode == code, text
    assert "Traceback" not in text, text
    for line in must:
        assert line in text, f"missing {line!r} in:\n{text}"
    for line in must_not:
        assert line not in text, f"unexpected {line!r} in:\n{text}"
    return text


def check_json(r: subprocess.CompletedProcess, code: int, must=(), must_not=()):
    """`check`, then the JSON document the command wrote on stdout (stderr may carry heartbeat lines on a slow run)."""
    import json

    check(r, code, must, must_not)
    return json.loads(r.stdout)
