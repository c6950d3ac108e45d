"""Keys files: JSON lines, one launch key each (`{"key": "<canonical text>", ...}`), as the runtime recorder
(`NBXCERT_KEY_RECORD`) writes them and `certify --keys` / `verify --keys` / `coverage --keys` read them.

Appends are one `write()` of one line to a file opened with O_APPEND under an exclusive lock, so concurrent processes
interleave whole lines and lose none.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterable
from pathlib import Path

from nbxcert.errors import KernelNotFound, KeyParseError, UsageError
from nbxcert.keys import LaunchKey, check_key, check_prune, parse_key

MAX_LINE = 4096


def read_keys(path: str | Path) -> list[LaunchKey]:
    """Every key of a keys file, in order, duplicates removed; a bad line is refused naming file and line."""
    from nbxcert.options import reachable

    path = reachable(Path(path), "keys file")
    if not path.is_file():
        # a directory (or a FIFO) was said not to exist, which sent the user looking for a typo
        what = "is not a regular file" if path.exists() else "does not exist"
        raise UsageError(f"keys file {path} {what}", hint='give a keys file: JSON lines, one {"key": ...} each')
    keys, seen = [], set()
    try:
        f = path.open("rb")
    except OSError as e:
        raise UsageError(
            f"keys file {path} cannot be read: {e.strerror}", hint="give a keys file you can read"
        ) from None
    with f:
        # Read in bytes, one bounded line at a time, and decode each line: a text-mode read raised
        # UnicodeDecodeError on a non-UTF-8 byte and read a line of any length whole before measuring it, and a
        # deeply nested line raised RecursionError (bugs found by tests/cli/test_fuzz.py::test_keys_file).
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
    # opened without waiting: a named pipe that nothing reads made a serving launch (and `verify`) wait for ever;
    # now that is an OSError (ENXIO) like any other failed write of the record
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o644)
    os.set_blocking(fd, True)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, line.encode("utf-8"))
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def write_keys(path: str | Path, keys: Iterable[LaunchKey]) -> None:
    for k in keys:
        append_record(path, {"key": k.text()})


def parse_kernels(text: str | None) -> list[str] | None:
    """The kernel names of a `--kernels a,b` filter, each a registered kernel (register your own first: `--spec`).
    Before this, `--kernels rmsnrom` matched nothing and `certify` exited 0 having certified nothing."""
    import difflib

    from nbxcert.kernels.spec import load_all

    if text is None:
        return None
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise UsageError(f"--kernels {text!r} has an empty name", hint="give kernel names separated by commas: a,b")
    registered = load_all()
    unknown = [n for n in names if n not in registered]
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(registered), n=1)
        raise KernelNotFound(
            f"no kernel named {', '.join(map(repr, unknown))} (--kernels {text})"
            + (f"; did you mean {close[0]}?" if close else ""),
        )
    return list(dict.fromkeys(names))


def gather_keys(profile, key_texts=(), keys_file=None, workload=None, kernels=None) -> list[LaunchKey]:
    """The keys a command was asked for: `--key` texts, a `--keys` file and/or a workload (a name or path for
    `load_workload`, or a `Workload` already formed, as `--hf-config`'s), in that order, only
    those of `kernels` when given (`parse_kernels`), duplicates removed. Every key is checked against its kernel's
    spec and `profile`'s ladders (`keys.check_key`) before any work starts, and nothing to do is refused, never a
    pass: no key asked for, a keys file with no key, or no key left of the kernels asked for (an empty keys file
    made `coverage` print 100% and exit 0, so a smoke test that recorded nothing passed the CI gate)."""
    from nbxcert.kernels.spec import get_spec
    from nbxcert.text import printable
    from nbxcert.workload import resolve, workload_keys

    if not key_texts and not keys_file and not workload:
        raise UsageError(
            "no keys asked for", hint="give --workload NAME|FILE, --hf-config CONFIG.json, --keys FILE or --key TEXT"
        )

    def checked(k: LaunchKey) -> LaunchKey:  # a key from the user's text: its fields, then its sizes for the prune
        spec = get_spec(k.kernel)
        return check_prune(spec, check_key(spec, k, profile), profile)

    keys: list[LaunchKey] = [checked(k) for k in map(parse_key, key_texts)]
    if keys_file:
        in_file = read_keys(keys_file)
        if not in_file:
            raise UsageError(
                f"keys file {printable(keys_file)} holds no keys",
                hint=f"record them first: run the application with NBXCERT_KEY_RECORD={printable(keys_file)}",
            )
        for k in in_file:
            try:
                keys.append(checked(k))
            except (KeyParseError, KernelNotFound) as e:
                raise type(e)(f"keys file {printable(keys_file)}: {e.message}", hint=e.hint) from None
    if workload:
        keys += workload_keys(resolve(workload), profile)  # all of them: the filter below says how many
    if kernels:
        asked = len(keys)
        keys = [k for k in keys if k.kernel in set(kernels)]
        if not keys:
            raise UsageError(
                f"none of the {asked} keys asked for is a key of --kernels {','.join(kernels)}",
                hint="leave --kernels out, or ask for keys of those kernels",
            )
    seen, unique = set(), []
    for k in keys:
        if k not in seen:
            seen.add(k)
            unique.append(k)
    return unique
