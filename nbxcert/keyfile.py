"""Keys files: JSON lines, one launch key each (`{"key": "<canonical text>", ...}`), as the runtime recorder
(`NBXCERT_KEY_RECORD`) writes them and `certify --keys` / `verify --keys` / `coverage --keys` read them.

Appends are one `write()` of one line to a file opened with O_APPEND under an exclusive lock, so concurrent processes
interleave whole lines and lose none.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Iterable

from nbxcert.errors import KeyParseError, UsageError
from nbxcert.keys import LaunchKey, parse_key

MAX_LINE = 4096


def read_keys(path: str | Path) -> list[LaunchKey]:
    """Every key of a keys file, in order, duplicates removed; a bad line is refused naming file and line."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"keys file {path} does not exist")
    keys, seen = [], set()
    try:
        f = path.open("rb")
    except OSError as e:
        raise UsageError(f"keys file {path} cannot be read: {e.strerror}") from None
    with f:
        # Read in bytes, one bounded line at a time, and decode each line: a text-mode read raised
        # UnicodeDecodeError on a non-UTF-8 byte and read a line of any length whole before measuring it, and a
        # deeply nested line raised RecursionError (bugs found by tests/test_fuzz.py::test_keys_file).
        for n, raw in enumerate(iter(lambda: f.readline(MAX_LINE + 1), b""), 1):
            if len(raw) > MAX_LINE and not raw.endswith(b"\n"):
                raise KeyParseError(f"{path}:{n}: line is longer than {MAX_LINE} bytes")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise KeyParseError(f"{path}:{n}: not UTF-8 text (byte {e.start})") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):
                raise KeyParseError(f"{path}:{n}: not a JSON object") from None
            if not isinstance(record, dict) or not isinstance(record.get("key"), str):
                raise KeyParseError(f"{path}:{n}: a keys-file line is a JSON object with a 'key' string")
            try:
                key = parse_key(record["key"])
            except KeyParseError as e:
                raise KeyParseError(f"{path}:{n}: {e.message}", hint=e.hint) from None
            if key not in seen:
                seen.add(key)
                keys.append(key)
    return keys


def append_record(path: str | Path, record: dict) -> None:
    line = json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, line.encode("utf-8"))
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def write_keys(path: str | Path, keys: Iterable[LaunchKey]) -> None:
    for k in keys:
        append_record(path, {"key": k.text()})


def gather_keys(profile, key_texts=(), keys_file=None, workload=None, kernels=None) -> list[LaunchKey]:
    """The keys a command was asked for: `--key` texts, a `--keys` file and/or a `--workload`, in that order."""
    from nbxcert.workload import load_workload, workload_keys

    if not key_texts and not keys_file and not workload:
        raise UsageError("no keys asked for: give --workload NAME|FILE, --keys FILE or --key TEXT")
    keys: list[LaunchKey] = [parse_key(t) for t in key_texts]
    if keys_file:
        keys += read_keys(keys_file)
    if workload:
        keys += workload_keys(load_workload(workload), profile, set(kernels) if kernels else None)
    if kernels:
        keys = [k for k in keys if k.kernel in set(kernels)]
    seen, unique = set(), []
    for k in keys:
        if k not in seen:
            seen.add(k)
            unique.append(k)
    return unique
