"""Serving's lookup: the config every kernel launch of nbxcert runs with, found for its key.

A launch forms its key, looks it up for the profile and memory class in force across the certificate search path
(`NBXCERT_CERTIFIED_DIR`, colon-separated, then the shipped `certificates/`), and runs the certified config. The
profile in force and the directories read are printed once per process. A key with no certificate:
- in certified-only mode (`NBXCERT_CERTIFIED_ONLY=1`) raises `KeyNotCertified` naming the kernel, the key, the profile
  and the directories searched: never a sweep;
- otherwise is swept at run time on the launch's own arguments (`nbxcert.serving.runtime_sweep`), said once per
  process, and kept in a local cache file (under the user's cache directory, never a certificate directory); with
  `NBXCERT_UNCERTIFIED=default` it runs the kernel's untuned default instead (said once per process).
`NBXCERT_KEY_RECORD=PATH` appends every key formed (served, swept or refused) to a keys file. A certified entry's
provenance is checked where it is found (`nbxcert.serving.provenance`).

Compiled winners: on a GPU profile the bundles on the search path (`nbxcert.serving.bundles`) are opened with the
state and their lookup registered with the kernel layer, so a launch loads its certified winner instead of compiling it.

Imports at module level: `nbxcert.errors`, `nbxcert.keys`, serving's notices and provenance. Inside functions: the
checks of the NBXCERT_* settings (`nbxcert.options`), the backend in force, the profiles, the index, the kernel spec's
`Config`, the keys file (key recording), the atomic writer of certificates (the run-time cache), the certificate
reader (what other memory classes hold, where none is this card's), the launch module's plans (forgotten on `reset`)
and the bundles (on a GPU profile, and on `reset`). No sweep, no CLI, no oracle: the run-time sweep module is
imported on a miss only. The warm path is one dict lookup.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbxcert import files
from nbxcert.errors import KeyNotCertified, KeyParseError, ProvenanceMismatch
from nbxcert.keys import make_key
from nbxcert.serving.notices import forget as forget_notices
from nbxcert.serving.notices import say_once
from nbxcert.serving.provenance import Machine, check_provenance, this_machine

if TYPE_CHECKING:
    from nbxcert.serving.runtime_sweep import RuntimeLaunch

_lock = threading.RLock()


@dataclass
class ServingState:
    """What this process serves from: read once (`state`), forgotten by `reset`."""

    profile: Any
    memory_class: str
    dirs: list[Path]
    index: Any
    certified_only: bool
    uncertified: str  # what a key with no certificate gets: "sweep" (default) or "default"
    record: str | None
    runtime_cache: dict[str, dict]
    runtime_cache_path: Path
    machine: Machine | None = None  # what a certification's provenance is compared with
    strict_provenance: bool = False  # NBXCERT_STRICT_PROVENANCE=1: a certification made elsewhere is refused
    bundles: Any = None  # the compiled winners launches load (`bundles.BundleSource`), None when no bundle is used


_state: ServingState | None = None
_fast: dict[tuple, Any] = {}  # (kernel, problem items, dtypes) -> Config: the warm path
_override: dict[str, Any] = {}


def configure(
    dirs: Sequence[Path] | None = None,
    certified_only: bool | None = None,
    device: tuple[str, str] | None = None,
) -> None:
    """Serve from exactly `dirs` (instead of the search path) and/or force certified-only mode, and/or serve the
    certificates of `device`, a (profile, memory class) pair such as ("hopper", "141GB"), instead of those of the
    device kernels launch on (a process that cross-compiles for a GPU it does not have: `benchmarks/bench_host.py`);
    resets the state. Used by `nbxcert verify --dir ... --certified-only`."""
    reset()
    _override.clear()
    if dirs is not None:
        _override["dirs"] = [Path(d) for d in dirs]
    if certified_only is not None:
        _override["certified_only"] = certified_only
    if device is not None:
        from nbxcert.profiles import get_profile

        _override["device"] = (get_profile(device[0]), str(device[1]))


@contextlib.contextmanager
def configured(dirs: Sequence[Path] | None = None, certified_only: bool | None = None) -> Iterator[None]:
    """`configure` for the length of a `with` block: afterwards the state is reset and the settings in force before
    it come back, so a command run inside a serving process (`verify`, `warm`) leaves that process's serving as it
    found it."""
    with _lock:
        saved = dict(_override)
    configure(dirs, certified_only)
    try:
        yield
    finally:
        reset()
        with _lock:
            _override.clear()
            _override.update(saved)


def search_path() -> list[Path]:
    """The certificate directories, in the order they are searched (first wins)."""
    if "dirs" in _override:
        return list(_override["dirs"])
    dirs = [Path(p) for p in os.environ.get("NBXCERT_CERTIFIED_DIR", "").split(":") if p.strip()]
    dirs.append(Path(str(resources.files("nbxcert.shipped_certificates"))))
    return dirs


def profile_in_force():
    """(profile, memory class) of the device kernels launch on in this process, or the one `configure(device=...)`
    named."""
    if "device" in _override:
        return _override["device"]
    from nbxcert.kernels.backends import select
    from nbxcert.profiles import get_profile, match_nvidia

    choice = select()
    if choice.name == "interpreter":
        return get_profile("cpu/interpreter"), "cpu"
    from nbxcert.kernels.backends import cuda
    from nbxcert.memory_class import memory_class

    info = cuda.device_info(0)
    profile, _how = match_nvidia(info.compute_capability)
    return profile, memory_class(profile, info.total_memory, info.attributes.get("multiprocessor_count"))


def _runtime_cache_path(profile_key: str, memory_class: str) -> Path:
    from nbxcert.index import cache_dir

    return cache_dir() / "runtime" / f"{profile_key.replace('/', '_')}.{memory_class}.json"


def state() -> ServingState:
    """This process's serving state, read on first use: the profile in force, the index of the search path, the
    run-time cache and the NBXCERT_* settings."""
    global _state
    with _lock:
        if _state is None:
            from nbxcert.index import load_index
            from nbxcert.options import env_flag

            # the settings first, before any index is built: a value other than 1 or 0 (`=yes`, `=true`) was read
            # as off, with no word of it (an application meant to be certified-only swept at run time)
            strict = env_flag("NBXCERT_STRICT_PROVENANCE")
            certified_only = _override.get("certified_only")
            if certified_only is None:
                certified_only = env_flag("NBXCERT_CERTIFIED_ONLY")
            uncertified = uncertified_mode()
            profile, memory_class = profile_in_force()
            dirs = search_path()
            found: list[str] = []
            # a directory that cannot be searched is skipped as one that is not there: an application keeps running
            index = load_index([d for d in dirs if files.is_dir(d)], profile.key, memory_class, notices=found)
            for n in found:
                say_once(f"[nbxcert] {n}")
            rt_path = _runtime_cache_path(profile.key, memory_class)
            runtime = {}
            # a cache directory that cannot be searched (NBXCERT_CACHE_DIR mode 000) raised PermissionError from
            # is_file(): a traceback from `verify` and a crash of the application's first launch
            if files.is_file(rt_path):
                try:
                    runtime = json.loads(rt_path.read_text())
                except ValueError:
                    say_once(f"[nbxcert] the run-time sweep cache {rt_path} is not valid JSON; starting it afresh")
                except OSError as e:
                    say_once(f"[nbxcert] the run-time sweep cache {rt_path} cannot be read ({e.strerror}); not used")
            compiled = _register_bundles(profile, dirs, strict, memory_class)
            n_dirs = sum(1 for d in dirs if files.is_dir(d))
            say_once(
                f"[nbxcert] certified: {profile.name} ({memory_class} class), {len(index)} keys from {n_dirs} "
                f"director{'y' if n_dirs == 1 else 'ies'}{_other_classes(dirs, profile.key, memory_class, len(index))}"
            )
            _state = ServingState(
                profile,
                memory_class,
                dirs,
                index,
                certified_only,
                uncertified,
                os.environ.get("NBXCERT_KEY_RECORD") or None,
                runtime,
                rt_path,
                machine=this_machine(profile.key),
                strict_provenance=strict,
                bundles=compiled,
            )
        return _state


def _other_classes(dirs: Sequence[Path], profile_key: str, memory_class: str, served: int) -> str:
    """Where no key is certified for this card's memory class: what the directories hold for the profile's other
    classes (an index serves its own class only), so a card that finds none of its own is told why. Every file of
    the profile is read for it, only then (once a process, as the line is said)."""
    if served or memory_class == "cpu":
        return ""
    from collections import Counter

    from nbxcert.certificates import class_entries, profile_certificates

    counts: Counter = Counter()
    # the files the index was just built from or found built from (a damaged one was refused there, before this)
    for _path, cert in profile_certificates([d for d in dirs if files.is_dir(d)], profile_key):
        counts.update(c for e in cert.entries.values() for c in class_entries(e))
    counts.pop(memory_class, None)
    if not counts:
        return ""
    held = ", ".join(f"{n} of the {c} class" for c, n in sorted(counts.items()))
    return (
        f"; they hold {held}, not served on this card (certify on it: nbxcert certify --profile "
        f"{profile_key.split('/')[-1]} --out DIR, then NBXCERT_CERTIFIED_DIR=DIR)"
    )


def _register_bundles(profile, dirs: Sequence[Path], strict: bool, memory_class: str):
    """The bundles of compiled winners on the search path for this card's memory class, registered with the kernel
    layer (`serving.bundles`); nothing is imported or opened for a profile that compiles nothing (the interpreter)."""
    if profile.target_arch is None:
        return None
    from nbxcert.serving.bundles import register

    return register(profile, dirs, strict, memory_class)


def reset() -> None:
    """Forget the process's serving state (tests, or after changing NBXCERT_* variables)."""
    global _state
    from nbxcert.kernels.launch import forget_plans
    from nbxcert.serving.bundles import unregister

    with _lock:
        _state = None
        _fast.clear()
        forget_notices()
        forget_plans()
        unregister()


UNCERTIFIED_MODES = ("sweep", "default")


def uncertified_mode() -> str:
    """NBXCERT_UNCERTIFIED: what a key with no certificate gets outside certified-only mode: `sweep` (the default; a
    run-time sweep on the launch's own arguments) or `default` (the kernel's untuned default, said once)."""
    from nbxcert.options import env_choice

    return env_choice("NBXCERT_UNCERTIFIED", UNCERTIFIED_MODES, "sweep", "a mode")


def _record(st: ServingState, key_text: str, event: str) -> None:
    if st.record:
        from nbxcert.keyfile import append_record

        append_record(st.record, {"key": key_text, "event": event, "profile": st.profile.key, "time": time.time()})


def config_for(
    spec,
    problem: Mapping[str, Any],
    dtypes: Sequence[str],
    runtime: RuntimeLaunch | dict | Callable[[], RuntimeLaunch] | None = None,
):
    """The config a launch of `spec` runs with: certified, else swept at run time (or refused, certified-only).
    `runtime` is a `RuntimeLaunch`, the keyword arguments of one, or a function of no arguments that makes one (each
    used only when a sweep needs it)."""
    fast_key = (spec.name, tuple(problem.items()), tuple(dtypes))
    cfg = _fast.get(fast_key)
    if cfg is not None:
        return cfg
    with _lock:
        st = state()
        try:
            key = make_key(spec, problem, dtypes, st.profile)
        except KeyParseError as e:
            if st.certified_only:
                raise KeyNotCertified(
                    f"kernel {spec.name}: no launch key can be formed for problem {dict(problem)} ({e.message}); "
                    f"certified-only mode refuses it (profile {st.profile.key})"
                ) from None
            raise
        text = key.text()
        entry = st.index.get(text)
        if entry is not None:
            try:
                check_provenance(spec, entry, text, st.profile, st.machine, st.strict_provenance)
            except ProvenanceMismatch:
                _record(st, text, "refused")
                raise
            cfg = certified_config(spec, entry, text)
            _record(st, text, "served")
        elif text in st.runtime_cache and not st.certified_only:  # a winner swept by an earlier run is no certificate
            from nbxcert.kernels.spec import Config

            cfg = Config.from_dict(st.runtime_cache[text]["config"])
            _record(st, text, "swept")
        elif st.certified_only:
            _record(st, text, "refused")
            searched = ", ".join(str(d) for d in st.dirs)
            raise KeyNotCertified(
                f"kernel {spec.name}: key {text} is not certified for {st.profile.key} ({st.memory_class} class); "
                f"searched: {searched}",
                hint=f"certify it: nbxcert certify --profile {st.profile.name} --key '{text}'",
            )
        elif st.uncertified == "default":
            say_once(
                f"[nbxcert] {spec.name}: key {text} has no certificate for {st.profile.key}; running the kernel's "
                "untuned default (NBXCERT_UNCERTIFIED=default)"
            )
            cfg = spec.untuned(problem)
            _record(st, text, "default")
        else:
            from nbxcert.serving.runtime_sweep import sweep_at_run_time

            say_once(
                f"[nbxcert] {spec.name}: key {text} has no certificate for {st.profile.key}; sweeping it at run time "
                f"(certify it once: nbxcert certify --profile {st.profile.name} --key '{text}' --out DIR, then put "
                "DIR on NBXCERT_CERTIFIED_DIR)"
            )
            cfg = sweep_at_run_time(spec, problem, st.profile, runtime, key.dtypes)
            st.runtime_cache[text] = {"config": cfg.as_dict(), "date": time.strftime("%Y-%m-%d")}
            _save_runtime_cache(st)
            _record(st, text, "swept")
        _fast[fast_key] = cfg
        return cfg


def certified_config(spec, entry: Mapping[str, Any], key_text: str):
    """The winner of a certified index entry, as a `Config`; `CertificateInvalid` when it is not a candidate of
    `spec` (a certificate made for other code)."""
    from nbxcert.errors import CertificateInvalid
    from nbxcert.kernels.spec import Config

    cfg = Config.from_dict(entry["winner"]["config"])
    if cfg not in set(spec.candidates):
        raise CertificateInvalid(
            f"certificate for {key_text}: winner {cfg.label()} is not a candidate of kernel {spec.name}",
            hint="re-certify the key, or run `nbxcert validate` on the certificate directory",
        )
    return cfg


def _save_runtime_cache(st: ServingState) -> None:
    from nbxcert.files import atomic_write

    st.runtime_cache_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(st.runtime_cache_path, json.dumps(st.runtime_cache, indent=1, sort_keys=True))
