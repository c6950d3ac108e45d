"""Launch keys: the kernel's stable name, its bucketed key fields and its dtypes, in one canonical text.

    rmsnorm[n_cols=2048,n_rows=512;float16,float16]@v1

Fields are sorted by name; values are non-negative integers or lower-case words; dtypes keep the spec's order; the
`@vN` suffix is the key format's version, so a key written by an older nbxcert is recognised as old, never misread.
The certifier, the runtime and workload files all form keys through `make_key`, so they agree by construction.

Buckets: a field with a ladder (a device-file fact) is rounded up to the smallest ladder value >= the size; the bucket
`(previous rung, rung]` is then certified at both ends (correctness at its smallest and largest member, timing at its
largest). A size above the top rung is its own bucket of one, never silently served by the top rung's certificate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from nbxcert.errors import KeyParseError

KEY_VERSION = 1
_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
_WORD = re.compile(r"[a-z][a-z0-9_]*\Z")
_FIELD = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")  # problem names such as M, N, K keep their case
_KEY = re.compile(r"(?P<name>[a-z][a-z0-9_]*)\[(?P<fields>[^;\]]*);(?P<dtypes>[^\]]*)\]@v(?P<version>\d+)\Z")


@dataclass(frozen=True, order=True)
class LaunchKey:
    """A launch key. `fields` is sorted by name; values are ints or words (flags are ints 0/1)."""

    kernel: str
    fields: tuple[tuple[str, int | str], ...]
    dtypes: tuple[str, ...]
    version: int = KEY_VERSION

    def __post_init__(self):
        if not _NAME.match(self.kernel):
            raise KeyParseError(f"kernel name '{self.kernel}' in a key must be lower-case letters, digits, _")
        names = [n for n, _ in self.fields]
        if names != sorted(names) or len(set(names)) != len(names):
            raise KeyParseError(f"key fields {names} must be unique and sorted")
        for n, v in self.fields:
            if not _FIELD.match(n):
                raise KeyParseError(f"key field name {n!r} must be letters, digits and _")
            if isinstance(v, bool) or not isinstance(v, (int, str)):
                raise KeyParseError(f"key field {n}={v!r} must be an int or a word")
            if isinstance(v, int) and v < 0:
                raise KeyParseError(f"key field {n}={v} must not be negative")
            if isinstance(v, str) and not _WORD.match(v):
                raise KeyParseError(f"key field {n}={v!r} must be a lower-case word")
        for d in self.dtypes:
            if not _NAME.match(d):
                raise KeyParseError(f"dtype '{d}' in a key must be a dtype name")

    def text(self) -> str:
        fields = ",".join(f"{n}={v}" for n, v in self.fields)
        return f"{self.kernel}[{fields};{','.join(self.dtypes)}]@v{self.version}"

    def __str__(self) -> str:
        return self.text()

    def field(self, name: str) -> int | str:
        for n, v in self.fields:
            if n == name:
                return v
        raise KeyError(name)

    @property
    def values(self) -> dict[str, int | str]:
        return dict(self.fields)


def parse_key(text: str) -> LaunchKey:
    """The key of a canonical text; `KeyParseError` saying what is wrong with it. An old version is refused as old."""
    text = text.strip()
    m = _KEY.match(text)
    if not m:
        raise KeyParseError(f"{text!r} is not a launch key (expected name[field=value,...;dtype,...]@vN)")
    version = _digits(text, "the version", m.group("version"))
    if version != KEY_VERSION:
        age = "older" if version < KEY_VERSION else "newer"
        raise KeyParseError(
            f"key '{text}' is in key format v{version}, {age} than this nbxcert's v{KEY_VERSION}",
            hint="re-record the keys (NBXCERT_KEY_RECORD) or re-certify with this nbxcert",
        )
    fields = []
    if m.group("fields"):
        for part in m.group("fields").split(","):
            if "=" not in part:
                raise KeyParseError(f"key '{text}': field '{part}' has no '='")
            n, v = part.split("=", 1)
            if re.fullmatch(r"[0-9]+", v):  # ASCII digits only: str.isdigit() accepts '²', which int() refuses
                value: int | str = _digits(text, f"value '{v[:20]}' of {n}", v)
                if str(value) != v:
                    raise KeyParseError(f"key '{text}': value '{v}' of {n} has leading zeros (not canonical)")
            else:
                value = v
            fields.append((n, value))
    dtypes = tuple(d for d in m.group("dtypes").split(",")) if m.group("dtypes") else ()
    key = LaunchKey(m.group("name"), tuple(fields), dtypes, version)
    if key.text() != text:
        raise KeyParseError(f"key '{text}' is not canonical; its canonical form is '{key.text()}'")
    return key


MAX_DIGITS = 40  # far above any size a launch has (2**64 has 20 digits)


def _digits(text: str, what: str, digits: str) -> int:
    """The integer of a run of ASCII digits in a key. Refused when longer than MAX_DIGITS: int() refuses more than
    4300 digits with a ValueError, which reached the caller as a traceback (bug found by
    tests/test_fuzz.py::test_key_text)."""
    if len(digits) > MAX_DIGITS:
        raise KeyParseError(f"key {text[:200]!r}: {what} has {len(digits)} digits, more than {MAX_DIGITS}")
    return int(digits)


def bucket(value: int, ladder: Sequence[int]) -> int:
    """The rung a size falls in: the smallest ladder value >= value; above the top rung, the value itself."""
    for rung in ladder:
        if value <= rung:
            return rung
    return value


def bucket_range(rung: int, ladder: Sequence[int]) -> tuple[int, int]:
    """(smallest, largest) member of the bucket whose upper end is `rung`."""
    if rung not in ladder:
        return (rung, rung)
    i = list(ladder).index(rung)
    return ((ladder[i - 1] + 1) if i > 0 else 1, rung)


def _value(v: Any) -> int | str:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, str)):
        return v
    if hasattr(v, "__index__"):
        return int(v)
    raise KeyParseError(f"key value {v!r} of type {type(v).__name__} is not an int, bool or word")


def make_key(spec, problem: Mapping[str, Any], dtypes: Sequence[str], profile) -> LaunchKey:
    """The key of one launch of `spec` (its problem and dtypes) under `profile`'s ladders."""
    fields = []
    for f in spec.key_fields:
        if f.name not in problem:
            raise KeyParseError(
                f"kernel {spec.name}: problem {dict(problem)} lacks key field '{f.name}'",
                hint=f"every launch of {spec.name} must give its key fields {[k.name for k in spec.key_fields]}",
            )
        v = _value(problem[f.name])
        if f.ladder is not None:
            if not isinstance(v, int):
                raise KeyParseError(f"kernel {spec.name}: bucketed field {f.name}={v!r} is not a size")
            v = bucket(v, profile.ladder(f.ladder))
        fields.append((f.name, v))
    return LaunchKey(spec.name, tuple(sorted(fields)), tuple(str(d) for d in dtypes))


def key_problems(spec, key: LaunchKey, profile) -> dict[str, dict[str, Any]]:
    """The problems a key is certified at: `smallest` and `largest` members of every bucket (correctness) and
    `timing` (the largest, the size the certified config serves at worst)."""
    values = key.values
    small, large = dict(values), dict(values)
    for f in spec.key_fields:
        if f.ladder is not None:
            lo, hi = bucket_range(int(values[f.name]), profile.ladder(f.ladder))
            small[f.name], large[f.name] = lo, hi
    return {"smallest": small, "largest": large, "timing": large}
