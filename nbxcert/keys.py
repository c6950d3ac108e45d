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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nbxcert.errors import KeyParseError, NbxcertError

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
    try:
        key = LaunchKey(m.group("name"), tuple(fields), dtypes, version)
    except KeyParseError as e:  # said which field was wrong but not in which key (`--key A --key B`: which?)
        raise KeyParseError(f"key '{text}': {e.message}", hint=_order_hint(fields, e)) from None
    if key.text() != text:
        raise KeyParseError(f"key '{text}' is not canonical; its canonical form is '{key.text()}'")
    return key


def _order_hint(fields: list[tuple[str, int | str]], e: KeyParseError) -> str | None:
    """The next step for a key whose fields are out of order: the same fields in order (None: the error's own)."""
    names = [n for n, _ in fields]
    if len(set(names)) != len(names) or names == sorted(names):
        return None
    return "write the fields sorted by name: " + ",".join(f"{n}={v}" for n, v in sorted(fields))


MAX_DIGITS = 40  # far above any size a launch has (2**64 has 20 digits)


def _digits(text: str, what: str, digits: str) -> int:
    """The integer of a run of ASCII digits in a key. Refused when longer than MAX_DIGITS: int() refuses more than
    4300 digits with a ValueError, which reached the caller as a traceback (bug found by
    tests/cli/test_fuzz.py::test_key_text)."""
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


# The largest size a key may hold: a Triton integer argument is at most 64 bits, so no launch has a size above it.
MAX_SIZE = 2**63 - 1


def _field_kinds(spec) -> dict[str, type]:
    """Each key field's kind (int: a size or a flag; str: a word) where the spec's example problems all agree on it."""
    kinds: dict[str, type] = {}
    for f in spec.key_fields:
        seen = {type(p[f.name]) for p in spec.example_problems if f.name in p}
        seen = {int if t is bool or (t is not str and hasattr(t, "__index__")) else t for t in seen}
        if len(seen) == 1 and next(iter(seen)) in (int, str):
            kinds[f.name] = next(iter(seen))
    return kinds


def check_key(spec, key: LaunchKey, profile=None) -> LaunchKey:
    """`key` when `spec`'s launches can form it under `profile`; else `KeyParseError` naming the key, what is wrong
    and the key to use instead. Refused: a key field missing or not the kernel's, a word where the kernel's example
    problems give a size (or the reverse), a size above 64 bits, dtypes the kernel does not take, and (with `profile`)
    a bucketed size that is not a rung of the profile's ladder: a launch rounds a size up to its rung, so no launch
    forms such a key, and `nbxcert validate` refuses a certificate of it.

    Before this, a key missing a field reached `key_problems` and failed there with a `KeyError` traceback (`nbxcert
    certify --key 'rmsnorm[n_cols=64;float16,float16]@v1'`), and a key off the ladder was certified into an entry
    `nbxcert validate` then refused."""
    text = key.text()
    if key.kernel != spec.name:
        raise KeyParseError(f"key '{text}' is a key of kernel {key.kernel}, not of {spec.name}")
    want = [f.name for f in spec.key_fields]
    have = list(key.values)
    missing = [n for n in want if n not in key.values]
    extra = [n for n in have if n not in want]
    if missing or extra:
        parts = ([f"lacks key field{'s' if len(missing) > 1 else ''} {', '.join(missing)}"] if missing else []) + (
            [f"has field{'s' if len(extra) > 1 else ''} {', '.join(extra)} that {spec.name} does not key on"]
            if extra
            else []
        )
        raise KeyParseError(
            f"key '{text}' {' and '.join(parts)}",
            hint=f"a {spec.name} key has the fields {', '.join(sorted(want))}; `nbxcert keys --profile P --workload W` "
            "prints keys as launches form them",
        )
    kinds = _field_kinds(spec)
    for f in spec.key_fields:
        v = key.values[f.name]
        kind = int if f.ladder is not None else kinds.get(f.name)
        if kind is not None and not isinstance(v, kind):
            examples = sorted({str(_value(p[f.name])) for p in spec.example_problems if f.name in p})[:4]
            raise KeyParseError(
                f"key '{text}': {f.name}={v} is a {'word' if kind is int else 'number'}, but {spec.name}'s "
                f"{f.name} is a {'size' if kind is int else 'word'}",
                hint=f"{spec.name}'s example problems give {f.name}={' or '.join(examples)}"
                if examples
                else f"{f.name} is a size on the '{f.ladder}' ladder",
            )
        if isinstance(v, int) and v > MAX_SIZE:
            raise KeyParseError(f"key '{text}': {f.name}={v} is above 2**63 - 1, more than a launch argument holds")
    if key.dtypes not in spec.dtypes:
        supported = ", ".join("/".join(c) for c in spec.dtypes)
        raise KeyParseError(
            f"key '{text}': dtypes {'/'.join(key.dtypes) or '(none)'} are not among {spec.name}'s: {supported}",
            hint=f"a {spec.name} key lists the dtypes of {', '.join(spec.dtype_args)}, in that order",
        )
    if profile is not None:
        for f in spec.key_fields:
            if f.ladder is None:
                continue
            v = key.values[f.name]
            ladder = profile.ladder(f.ladder)
            if ladder and v not in ladder and v <= ladder[-1]:
                rung = bucket(v, ladder)
                right = LaunchKey(key.kernel, tuple((n, rung if n == f.name else x) for n, x in key.fields), key.dtypes)
                raise KeyParseError(
                    f"key '{text}': {f.name}={v} is not a rung of {profile.key}'s '{f.ladder}' ladder "
                    f"({', '.join(map(str, ladder))}); a launch of {f.name}={v} has the key '{right.text()}'",
                    hint=f"use {f.name}={rung}, the rung {v} rounds up to (above {ladder[-1]}, a size is its own rung)",
                )
    return key


def check_prune(spec, key: LaunchKey, profile) -> LaunchKey:
    """`key` when `spec`'s prune answers for it at both ends of its bucket under `profile` (the first thing a sweep, a
    census or a run-time lookup asks); else `KeyParseError` naming the key and what the prune raised. A key text can
    hold sizes no launch has: `kv_heads=0` made decode attention's prune divide by zero (a traceback from certify)."""
    problems = key_problems(spec, key, profile)
    for role in ("smallest", "largest"):
        try:
            spec.prune(spec.candidates, problems[role], profile)
        except NbxcertError:
            raise
        except Exception as e:  # noqa: BLE001 - whatever the kernel's own code raises on these sizes refuses the key
            raise KeyParseError(
                f"key '{key.text()}': kernel {spec.name} cannot take these sizes (its prune raised "
                f"{type(e).__name__}: {e} at {problems[role]})",
                hint=f"`nbxcert keys --profile {profile.name} --workload W` prints keys as launches form them",
            ) from None
    return key


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
