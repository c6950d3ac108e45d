"""Serving: the run-time lookup every kernel launch of nbxcert goes through.

A launch forms its key, looks it up for the profile and memory class in force across the certificate search path
(`NBXCERT_CERTIFIED_DIR`, colon-separated, then the shipped `certificates/`), and runs the certified config. The
profile in force and the directories read are printed once per process. A key with no certificate:
- in certified-only mode (`NBXCERT_CERTIFIED_ONLY=1`) raises `KeyNotCertified` naming the kernel, the key, the profile
  and the directories searched: never a sweep;
- otherwise is swept at run time on the launch's own arguments (candidates whose output disagrees with the others'
  consensus beyond the dtype tolerance are rejected), said once per process, and kept in a local cache file (under
  the user's cache directory, never a certificate directory); with `NBXCERT_UNCERTIFIED=default` it runs the
  kernel's untuned default instead (said once per process).
`NBXCERT_KEY_RECORD=PATH` appends every key formed (served, swept or refused) to a keys file.

Provenance is checked where a certified entry is found: a certification made with another Triton major version,
another NVIDIA driver major, or on a device of another profile than the index's (its provenance's compute
capability, or the interpreter) is served with one notice per difference and process, saying what differs; under
`NBXCERT_STRICT_PROVENANCE=1` it is refused (`ProvenanceMismatch`, naming the key and the difference).
`nbxcert doctor` counts the certificates that apply to this machine and the ones it rejects (`provenance_differences`).

This module imports no sweep, no CLI and no oracle; the warm path is one dict lookup.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from nbxcert.errors import KeyNotCertified, KeyParseError, NbxcertError, ProvenanceMismatch
from nbxcert.keys import make_key

_lock = threading.RLock()


@dataclass
class _State:
    profile: Any
    memory_class: str
    dirs: list[Path]
    index: Any
    certified_only: bool
    uncertified: str  # what a key with no certificate gets: "sweep" (default) or "default"
    record: str | None
    runtime_cache: dict[str, dict]
    runtime_cache_path: Path
    machine: Any = None  # `Machine`: what a certification's provenance is compared with
    strict_provenance: bool = False  # NBXCERT_STRICT_PROVENANCE=1: a certification made elsewhere is refused


_state: _State | None = None
_fast: dict[tuple, Any] = {}  # (kernel, problem items, dtypes) -> Config: the warm path
_said: set[str] = set()
_override: dict[str, Any] = {}


def configure(dirs: Sequence[Path] | None = None, certified_only: bool | None = None) -> None:
    """Serve from exactly `dirs` (instead of the search path) and/or force certified-only mode; resets the state.
    Used by `nbxcert verify --dir ... --certified-only`."""
    reset()
    _override.clear()
    if dirs is not None:
        _override["dirs"] = [Path(d) for d in dirs]
    if certified_only is not None:
        _override["certified_only"] = certified_only


def search_path() -> list[Path]:
    """The certificate directories, in the order they are searched (first wins)."""
    if "dirs" in _override:
        return list(_override["dirs"])
    dirs = [Path(p) for p in os.environ.get("NBXCERT_CERTIFIED_DIR", "").split(":") if p.strip()]
    dirs.append(Path(str(resources.files("nbxcert.shipped_certificates"))))
    return dirs


def profile_in_force():
    """(profile, memory class) of the device kernels launch on in this process."""
    from nbxcert.kernels.backends import select
    from nbxcert.profiles import get_profile, match_nvidia

    choice = select()
    if choice.name == "interpreter":
        return get_profile("cpu/interpreter"), "cpu"
    from nbxcert.kernels.backends import cuda

    info = cuda.device_info(0)
    profile, _how = match_nvidia(info.compute_capability)
    sku = profile.sku_for_memory(info.total_memory, info.attributes.get("multiprocessor_count"))
    return profile, (sku.memory_class if sku else f"{round(info.total_memory / 1e9)}GB")


def _say(text: str) -> None:
    if text not in _said:
        _said.add(text)
        print(text, file=sys.stderr)


def _runtime_cache_path(profile_key: str, memory_class: str) -> Path:
    from nbxcert.index import cache_dir

    return cache_dir() / "runtime" / f"{profile_key.replace('/', '_')}.{memory_class}.json"


def state() -> _State:
    global _state
    with _lock:
        if _state is None:
            from nbxcert.index import load_index

            profile, memory_class = profile_in_force()
            dirs = search_path()
            notices: list[str] = []
            index = load_index([d for d in dirs if d.is_dir()], profile.key, memory_class, notices=notices)
            for n in notices:
                _say(f"[nbxcert] {n}")
            rt_path = _runtime_cache_path(profile.key, memory_class)
            runtime = {}
            if rt_path.is_file():
                try:
                    runtime = json.loads(rt_path.read_text())
                except ValueError:
                    _say(f"[nbxcert] the run-time sweep cache {rt_path} is not valid JSON; starting it afresh")
            n_dirs = sum(1 for d in dirs if d.is_dir())
            _say(
                f"[nbxcert] certified: {profile.name} ({memory_class} class), {len(index)} keys from {n_dirs} "
                f"director{'y' if n_dirs == 1 else 'ies'}"
            )
            _state = _State(
                profile,
                memory_class,
                dirs,
                index,
                _override.get("certified_only", os.environ.get("NBXCERT_CERTIFIED_ONLY", "") == "1"),
                _uncertified_mode(),
                os.environ.get("NBXCERT_KEY_RECORD") or None,
                runtime,
                rt_path,
                machine=this_machine(profile.key),
                strict_provenance=os.environ.get("NBXCERT_STRICT_PROVENANCE", "") == "1",
            )
        return _state


def reset() -> None:
    """Forget the process's serving state (tests, or after changing NBXCERT_* variables)."""
    global _state
    from nbxcert.kernels.launch import forget_plans

    with _lock:
        _state = None
        _fast.clear()
        _said.clear()
        forget_plans()


UNCERTIFIED_MODES = ("sweep", "default")


def _uncertified_mode() -> str:
    """NBXCERT_UNCERTIFIED: what a key with no certificate gets outside certified-only mode: `sweep` (the default; a
    run-time sweep on the launch's own arguments) or `default` (the kernel's untuned default, said once)."""
    from nbxcert.errors import UsageError

    mode = os.environ.get("NBXCERT_UNCERTIFIED", "sweep").strip() or "sweep"
    if mode not in UNCERTIFIED_MODES:
        raise UsageError(f"NBXCERT_UNCERTIFIED={mode} is not one of {', '.join(UNCERTIFIED_MODES)}")
    return mode


def _record(st: _State, key_text: str, event: str) -> None:
    if st.record:
        from nbxcert.keyfile import append_record

        append_record(st.record, {"key": key_text, "event": event, "profile": st.profile.key, "time": time.time()})


@dataclass
class RuntimeLaunch:
    """What a run-time sweep needs from a launch: `run(config)` launches on the launch's own arguments, `outputs`
    are the tensors it writes, `restore` the in-place tensors to put back before each candidate."""

    run: Callable[[Any], None]
    outputs: Sequence[Any] = ()
    restore: Sequence[Any] = ()


def config_for(spec, problem: Mapping[str, Any], dtypes: Sequence[str], runtime: RuntimeLaunch | dict | None = None):
    """The config a launch of `spec` runs with: certified, else swept at run time (or refused, certified-only).
    `runtime` is a `RuntimeLaunch` or the keyword arguments of one (built only when a sweep needs it)."""
    fast_key = (spec.name, tuple(problem.items()), tuple(dtypes))
    cfg = _fast.get(fast_key)
    if cfg is not None:
        return cfg
    if isinstance(runtime, dict):
        runtime = RuntimeLaunch(**runtime)
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
            _check_provenance(st, spec, entry, text)
            cfg = _certified_config(spec, entry, text)
            _record(st, text, "served")
        elif text in st.runtime_cache:
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
            _say(
                f"[nbxcert] {spec.name}: key {text} has no certificate for {st.profile.key}; running the kernel's "
                "untuned default (NBXCERT_UNCERTIFIED=default)"
            )
            cfg = spec.default
            _record(st, text, "default")
        else:
            _say(
                f"[nbxcert] {spec.name}: key {text} has no certificate for {st.profile.key}; sweeping it at run time "
                f"(certify it once: nbxcert certify --profile {st.profile.name} --key '{text}')"
            )
            cfg = runtime_sweep(spec, problem, st.profile, runtime)
            st.runtime_cache[text] = {"config": cfg.as_dict(), "date": time.strftime("%Y-%m-%d")}
            _save_runtime_cache(st)
            _record(st, text, "swept")
        _fast[fast_key] = cfg
        return cfg


# --- provenance -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Machine:
    """What serving compares a certification's provenance with: the profile in force, the running Triton's major
    version and the NVIDIA driver's major ("none" under the interpreter)."""

    profile: str
    triton_major: str
    driver_major: str


def _major(version: Any) -> str:
    """The leading number of a version text ("3.6.0" -> "3", "580.159.04" -> "580"); "none" stays "none"."""
    text = str(version).strip()
    m = re.match(r"\d+", text)
    return m.group(0) if m else (text or "unknown")


def this_machine(profile_key: str) -> Machine:
    import triton

    from nbxcert.kernels.backends import select

    driver = "none"
    if select().name == "cuda":
        from nbxcert.doctor import _nvidia_driver_version

        driver = _major(_nvidia_driver_version())
    return Machine(profile_key, _major(triton.__version__), driver)


def provenance_profile(provenance: Mapping[str, Any]) -> str:
    """The profile of the device a certification was made on, from its provenance."""
    if provenance.get("backend") == "interpreter":
        return "cpu/interpreter"
    cc = str(provenance.get("compute_capability", ""))
    m = re.fullmatch(r"(\d{1,3})\.(\d{1,3})", cc)
    if m:
        from nbxcert.profiles import match_nvidia

        try:
            return match_nvidia((int(m.group(1)), int(m.group(2))))[0].key
        except NbxcertError:
            pass
    return f"an unknown profile (compute capability {cc or 'none'})"


def provenance_differences(provenance: Mapping[str, Any], here: Machine) -> list[str]:
    """What differs between where a certification was made and this machine, in words (empty: nothing that
    matters). Compared: the device's profile, Triton's major version, the NVIDIA driver's major."""
    differences = []
    made_on = provenance_profile(provenance)
    if made_on != here.profile:
        differences.append(f"made on a {made_on} device, this machine runs {here.profile}")
    triton = _major(provenance.get("triton", ""))
    if triton != here.triton_major:
        differences.append(f"made with Triton {triton}.x, this machine has Triton {here.triton_major}.x")
    driver = _major(provenance.get("driver", ""))
    if driver != here.driver_major:
        differences.append(f"made with driver {driver}, this machine's driver is {here.driver_major}")
    return differences


def _check_provenance(st: _State, spec, entry: Mapping[str, Any], key_text: str) -> None:
    """Refuse (strict) or say once per difference (default) a certification made elsewhere; nothing when it was
    made here."""
    if st.machine is None:
        return
    differences = provenance_differences(entry.get("provenance") or {}, st.machine)
    if not differences:
        return
    what = "; ".join(differences)
    if st.strict_provenance:
        _record(st, key_text, "refused")
        raise ProvenanceMismatch(
            f"kernel {spec.name}: the certification of {key_text} for {st.profile.key} was {what}; "
            "NBXCERT_STRICT_PROVENANCE=1 refuses it",
            hint=f"re-certify it here: nbxcert certify --profile {st.profile.name} --key '{key_text}' --force "
            "(or unset NBXCERT_STRICT_PROVENANCE to serve it with a notice)",
        )
    _say(
        f"[nbxcert] notice: serving {st.profile.key} certifications {what} (NBXCERT_STRICT_PROVENANCE=1 refuses "
        "them; `nbxcert doctor` lists them)"
    )


def _certified_config(spec, entry: dict, key_text: str):
    from nbxcert.errors import CertificateInvalid
    from nbxcert.kernels.spec import Config

    cfg = Config.from_dict(entry["winner"]["config"])
    if cfg not in set(spec.candidates):
        raise CertificateInvalid(
            f"certificate for {key_text}: winner {cfg.label()} is not a candidate of kernel {spec.name}",
            hint="re-certify the key, or run `nbxcert validate` on the certificate directory",
        )
    return cfg


def _save_runtime_cache(st: _State) -> None:
    from nbxcert.certificates import atomic_write

    st.runtime_cache_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(st.runtime_cache_path, json.dumps(st.runtime_cache, indent=1, sort_keys=True))


def runtime_sweep(spec, problem: Mapping[str, Any], profile, runtime: RuntimeLaunch | None):
    """Sweep a key on the launch's own arguments: every pruned-in candidate runs; those that fail, or whose output
    disagrees with the candidates' consensus (the element-wise median) beyond the dtype tolerance times the output's
    largest magnitude, are rejected; the fastest of the rest wins (the untuned default or the simplest within the
    noise)."""
    import numpy as np

    from nbxcert.errors import LaunchError
    from nbxcert.kernels.compare import compare
    from nbxcert.sweep import Outcome, choose_winner

    if runtime is None:
        raise LaunchError(f"kernel {spec.name}: the launch gave no way to sweep it at run time (a bug in nbxcert)")
    kept = spec.pruned_for(problem, profile).kept
    saved = [t.clone() for t in runtime.restore]
    results, rejected = [], []
    for cfg in kept:
        for dst, src in zip(runtime.restore, saved):
            dst.copy_(src)
        try:
            runtime.run(cfg)
            outs = [t.float64() for t in runtime.outputs]
        except NbxcertError:
            raise
        except Exception as e:  # noqa: BLE001 - a candidate that fails to compile or run is rejected, as in a sweep
            rejected.append(f"{cfg.label()}: {type(e).__name__}")
            continue
        results.append((cfg, outs))
    if rejected:
        _say(
            f"[nbxcert] {spec.name}: the run-time sweep rejected {len(rejected)} candidates ({'; '.join(rejected[:3])})"
        )
    if not results:
        raise LaunchError(f"kernel {spec.name}: no candidate ran at run time for problem {dict(problem)}")
    agreed = []
    for cfg, outs in results:
        ok = True
        for i, out in enumerate(outs):
            stack = np.stack([r[1][i] for r in results])
            consensus = np.median(stack, axis=0)
            # no oracle here, so no per-element error scale: agreement is judged norm-wise, against the largest
            # magnitude of the output (candidates that sum in another order legitimately differ where values cancel)
            finite = np.abs(consensus[np.isfinite(consensus)])
            scale = np.full(consensus.shape, finite.max() if finite.size else 0.0)
            tol = profile.tolerance(runtime.outputs[i].dtype.name)
            ok = ok and compare(out, consensus, scale, runtime.outputs[i].dtype, tol).ok
        if ok:
            agreed.append(cfg)
        else:
            _say(f"[nbxcert] {spec.name}: run-time sweep rejected {cfg.label()} (disagrees with the consensus)")
    timed = [Outcome(c, "correct", timing=_time(runtime, c)) for c in agreed]
    winner, _ = choose_winner(timed, spec.default)
    for dst, src in zip(runtime.restore, saved):
        dst.copy_(src)
    if winner is None:
        raise LaunchError(f"kernel {spec.name}: no candidate agreed with the consensus for problem {dict(problem)}")
    return winner.config


def _time(runtime: RuntimeLaunch, cfg) -> dict:
    from nbxcert.kernels.backends import select
    from nbxcert.runner import SCREEN_MS, _summary

    if select().name == "cuda":
        from nbxcert.kernels.backends import triton_cuda

        # 5 + 20 ms, at most the sweep's screen count of repetitions (each one is a host launch)
        timed = triton_cuda.time_events(lambda: runtime.run(cfg), 5.0, 20.0, max_repetitions=SCREEN_MS[2])
        return _summary(timed.times_ms, "cuda_events_gated" if timed.gated else "cuda_events_waiting")
    t0 = time.perf_counter()
    runtime.run(cfg)
    return _summary([(time.perf_counter() - t0) * 1e3], "interpreter_cpu")
