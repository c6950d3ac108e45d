"""`nbxcert bundle`: a profile's certified winners compiled for its GPU target and packed into one file (a bundle,
`nbxcert.serving.bundles`), which serving loads instead of compiling; and `--check`, the CI gate that tells a bundle
made from other certificates than the ones shipped beside it.

What is compiled. Each key asked for (a workload's, a keys file's, or every key certified in the directories) with a
certificate (the first directory holding it wins, as serving's index takes it): its certified winner (of the key's
first memory class, or with `--memory-class` of that class: an H100's winners, where they differ from an H200's, are
another bundle's, named `<name>.80GB.nbxbundle` for serving and CI's gate to read its class, as the shipped
`hopper.80GB.nbxbundle`), at the entry's certified problems (smallest, largest and timing members of its bucket) and,
with a workload (or `--launches-of` workloads), at every launch the workload makes at its real shape whose key it is
(a real shape may specialise otherwise than the bucket's ends: a size divisible by 16 or not). A key with no
certificate is skipped and named in the report.

How. As the census compiles (`nbxcert.census`): worker processes (`--jobs N`, default the CPU count) cross-compile for
the profile's target with no GPU (`nbxcert.kernels.backends.cross`), one key per request. For each problem the spec's
own `make_inputs` makes CPU tensors of the problem's shapes (`kernels.inputs.shape_only`: no value drawn) and the
spec's own launch runs them under both the kernel layer's recording (the `KernelLaunch`es: kernel, grid, arguments) and
the cross backend's (what Triton compiled for each), which pair in order. Each pair gives a launch's name as serving
will ask for it (`binaries.identity_of`, `binaries.specialization_of`), its launch record (`binaries.describe`) and its
cubin. Triton's on-disk cache holds every compile, so a rerun (after a kill, or of a bundle with one more key) only
loads. One request of each kernel and config goes first and the rest after (`warm.phases`): those that follow find it
compiled.

The bundle is written at the end, atomically (`files.atomic_write`): a killed build leaves the previous file or none,
never a part (and the temporary file it left is removed by the next build). The same certificates, Triton and nbxcert
give the same bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbxcert.errors import BackendUnavailable, KeyNotCertified, UsageError
from nbxcert.kernels.backends import cross
from nbxcert.kernels.backends.cross import Target
from nbxcert.memory_class import check_class, classes_of
from nbxcert.serving.bundles import (
    SCHEMA_VERSION,
    Bundle,
    canonical,
    entry_digest,
    named_class,
    record_digest,
    serialize,
)
from nbxcert.text import printable
from nbxcert.worker import Worker, one_line, serve_cross_compiling

if TYPE_CHECKING:
    from nbxcert.workload import Workload

TIMEOUT_PER_PROBLEM_S = 300.0  # one problem's compiles on a busy CPU (ptxas on a large tile takes a minute or more)
# Requests a worker answers before it is replaced: Triton keeps every kernel it compiled in memory (all its stages'
# text); a fresh worker reads its disk cache.
RECYCLE_AFTER = 25
_ENV_TARGET = "NBXCERT_BUNDLE_TARGET"
_ROLES = ("smallest", "largest", "timing")


# --- what is bundled --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Certified:
    """One key's certificate entry, as the bundle and its check read it."""

    key: str
    kernel: str
    dtype: str  # the certificate file's
    entry: dict[str, Any]
    path: Path


def certified_entries(dirs: Sequence[Path], profile_key: str, memory_class: str | None = None) -> dict[str, Certified]:
    """Every key certified for `profile_key` in `dirs` (each file validated whole; `CertificateInvalid` names a
    problem), the first directory (then the first file in path order) winning a key, as serving's index does: each
    key's entry of its first memory class, or of `memory_class` (keys with none of it left out). A card of another
    class is served its own class's winner, which may be another config: another bundle's binaries."""
    from nbxcert import certificates

    found = certificates.first_entries(dirs, profile_key, memory_class)
    return {text: Certified(text, cert.kernel, cert.dtype, entry, path) for text, (path, cert, entry) in found.items()}


@dataclass
class Item:
    """One key to bundle: its certified winner and the problems it is compiled at."""

    certified: Certified
    spec: str
    config: dict[str, Any]
    dtypes: tuple[str, ...]
    problems: list[dict[str, Any]]

    def request(self) -> dict[str, Any]:
        return {
            "op": "bundle",
            "key": self.certified.key,
            "spec": self.spec,
            "config": self.config,
            "dtypes": list(self.dtypes),
            "problems": self.problems,
            "seed": int(self.certified.entry["seed"]),
        }


@dataclass
class BundleReport:
    """What a build did: the keys bundled, skipped (no certificate) and failed (with the reason), its counts."""

    profile: str
    target: Target
    triton_version: str
    out: str
    jobs: int
    asked: int = 0
    keys: int = 0
    launches: int = 0
    binaries: int = 0
    bytes: int = 0
    written: bool = False
    seconds: float = 0.0
    skipped: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.written and not self.failed

    def line(self) -> str:
        what = (
            f"{self.keys} keys, {self.launches} launches, {self.binaries} binaries, {self.bytes} bytes -> {self.out}"
            if self.written
            else "nothing written"
        )
        return printable(
            f"[nbxcert] bundle {self.profile} ({self.target.text()}, Triton {self.triton_version}): {what}; "
            f"{len(self.skipped)} of {self.asked} keys skipped (no certificate), {len(self.failed)} failed; "
            f"{self.seconds:.0f} s, {self.jobs} workers"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "profile": self.profile,
            "target": self.target.as_dict(),
            "triton": self.triton_version,
            "out": self.out,
            "written": self.written,
            "ok": self.ok,
            "asked": self.asked,
            "keys": self.keys,
            "launches": self.launches,
            "binaries": self.binaries,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 1),
            "jobs": self.jobs,
            "skipped": self.skipped,
            "failed": [{"key": k, "reason": r} for k, r in self.failed],
        }


def bundle_target(profile) -> Target:
    """The compile target of a profile a bundle can serve: a CUDA GPU (nbxcert's launcher runs CUDA binaries)."""
    from nbxcert.census import target_of

    target = target_of(profile)
    if target.backend != "cuda":
        raise UsageError(
            f"profile {profile.key} compiles for {target.text()}; a bundle holds CUDA binaries for nbxcert's launcher",
            hint="bundle an NVIDIA profile (`nbxcert profiles` lists them)",
        )
    return target


def plan(
    profile,
    keys: Sequence[Any] | None,
    dirs: Sequence[Path],
    workload: str | Workload | None = None,
    kernels: Sequence[str] | None = None,
    memory_class: str | None = None,
    launches_of: Sequence[str | Workload] = (),
) -> tuple[list[Item], list[str], list[tuple[str, str]]]:
    """(the keys to compile, the keys skipped for want of a certificate, the keys refused with the reason). `keys`
    None: every key certified for the profile in `dirs` (only those of `kernels` when given); `memory_class`: that
    class's winners (`certified_entries`); `launches_of`: more workloads whose launches each key is also compiled at
    (as `workload`'s), for a bundle of every key that serves several models."""
    from nbxcert.errors import NbxcertError
    from nbxcert.kernels.spec import Config, get_spec
    from nbxcert.keys import make_key, parse_key

    certified = certified_entries(dirs, profile.key, memory_class)
    if keys is None:
        texts = sorted(t for t, c in certified.items() if not kernels or c.kernel in kernels)
    else:
        texts = [k.text() for k in keys]
    items: dict[str, Item] = {}
    skipped: list[str] = []
    refused: list[tuple[str, str]] = []
    for text in texts:
        found = certified.get(text)
        if found is None:
            skipped.append(text)
            continue
        try:
            spec = get_spec(found.kernel)
        except NbxcertError as e:
            refused.append((text, f"{e.message} (a kernel of your own: --spec MODULE)"))
            continue
        winner = found.entry["winner"]["config"]
        if Config.from_dict(winner) not in set(spec.candidates):
            refused.append((text, f"its certified winner {Config.from_dict(winner).label()} is not a candidate"))
            continue
        problems: list[dict[str, Any]] = []
        cp = found.entry["certified_problems"]
        for role in [*_ROLES, *sorted(set(cp) - set(_ROLES))]:
            if role in cp and cp[role] not in problems:
                problems.append(dict(cp[role]))
        items[text] = Item(found, spec.name, dict(winner), parse_key(text).dtypes, problems)
    shapes_of = [w for w in [workload, *launches_of] if w is not None]
    if shapes_of and items:
        from nbxcert.workload import launches, resolve

        for launch in (x for w in shapes_of for x in launches(resolve(w), profile)):
            text = make_key(get_spec(launch.kernel), launch.problem, launch.dtypes, profile).text()
            item = items.get(text)
            if item is not None and launch.problem not in item.problems:
                item.problems.append(dict(launch.problem))
    return list(items.values()), skipped, refused


def ptxas_version(target: Target) -> str:
    """The last line of `ptxas --version` of the ptxas Triton runs for `target` (Triton's own, unless
    TRITON_PTXAS_PATH names another)."""
    from triton.backends.nvidia.compiler import get_ptxas

    try:
        tool = get_ptxas(int(target.arch))
    except TypeError:  # a Triton whose get_ptxas takes no arch
        tool = get_ptxas()
    try:
        text = subprocess.run([tool.path, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise BackendUnavailable(f"cannot run Triton's ptxas ({printable(tool.path)}): {e}") from None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise BackendUnavailable(f"Triton's ptxas ({printable(tool.path)}) printed no version")
    return lines[-1]


# --- building ---------------------------------------------------------------------------------------------------------
def build(
    profile_name: str,
    keys: Sequence[Any] | None,
    dirs: Sequence[Path] | None,
    out: Path,
    workload: str | Workload | None = None,
    kernels: Sequence[str] | None = None,
    jobs: int | None = None,
    modules: Sequence[str] = (),
    progress: Callable[[int, int], None] | None = None,
    memory_class: str | None = None,
    launches_of: Sequence[str | Workload] = (),
) -> BundleReport:
    """Compile the certified winners of `keys` (None: every key certified in `dirs`; `dirs` None: serving's search
    path) for the profile's target and write the bundle `out` (see the module doc). `workload`: also compile each key
    at the workload's launches of it. `modules`: the user's own specs, imported here and in the workers.
    `progress(done, total)` after each key compiled. `memory_class`: that class's winners (default each key's first
    class's). `launches_of`: workloads whose launches each key is also compiled at."""
    import triton

    from nbxcert.census import load_census_specs
    from nbxcert.profiles import get_profile

    t0 = time.perf_counter()
    profile = get_profile(profile_name)
    target = bundle_target(profile)
    load_census_specs(profile, modules)
    check_class(profile, memory_class)
    if dirs is None:
        from nbxcert.serving import search_path

        dirs = search_path()
    jobs = max(1, jobs or os.cpu_count() or 1)
    report = BundleReport(profile.key, target, triton.__version__, str(out), jobs)
    items, report.skipped, report.failed = plan(profile, keys, dirs, workload, kernels, memory_class, launches_of)
    report.asked = len(items) + len(report.skipped) + len(report.failed)
    if not items:
        where = ", ".join(printable(d) for d in dirs)
        if report.failed:  # certified, but none usable: why the first was refused, not a call to certify
            key, why = report.failed[0]
            raise KeyNotCertified(
                f"none of the {report.asked} keys asked for can be bundled for {profile.key} from {where}: "
                f"{len(report.failed)} refused, the first {key}: {why}",
                hint="mend what the refusal names (`nbxcert validate DIR` lists every problem of the certificates), "
                "then bundle again",
            )
        raise KeyNotCertified(
            f"none of the {report.asked} keys asked for has a usable certificate for {profile.key} in {where}",
            hint=f"certify them first (`nbxcert certify --profile {profile.name} ... --out DIR`), then bundle with "
            "--dir DIR",
        )
    manifest_head = {
        "schema_version": SCHEMA_VERSION,
        "nbxcert_version": _nbxcert_version(),
        "triton_version": triton.__version__,
        "target": {"backend": target.backend, "arch": target.arch, "warp_size": target.warp_size},
        "ptxas_version": ptxas_version(target),
        "profile": profile.key,
    }
    replies = _compile(items, target, modules, jobs, progress)
    manifest, images = _assemble(items, replies, report)
    if manifest["keys"]:
        data = serialize({**manifest_head, **manifest}, images)
        _write(Path(out), data)
        report.written, report.bytes = True, len(data)
        report.keys, report.binaries = len(manifest["keys"]), len(manifest["binaries"])
        report.launches = len({_name(x) for k in manifest["keys"] for x in k["launches"]})
    report.seconds = time.perf_counter() - t0
    return report


def _nbxcert_version() -> str:
    from nbxcert._version import __version__

    return __version__


def _name(launch: Mapping[str, Any]) -> tuple[str, str, str]:
    return launch["identity"], launch["source_key"], launch["specialization"]


def _compile(
    items: list[Item], target: Target, modules: Sequence[str], jobs: int, progress
) -> list[dict[str, Any] | None]:
    """Each item's reply from the workers, in order (one request of each kernel and config first: `warm.phases`)."""
    from nbxcert.warm import phases
    from nbxcert.worker import drive_all

    requests = [item.request() for item in items]
    replies: list[dict[str, Any] | None] = [None] * len(requests)
    env = {_ENV_TARGET: json.dumps(target.as_dict())}
    workers = [BundleWorker(env, list(modules)) for _ in range(min(jobs, len(requests)))]
    done = [0]
    if progress is not None:
        progress(0, len(requests))

    def answered(_count: int) -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0], len(requests))

    try:
        for phase in phases(requests):
            if not phase:
                continue
            timeout = TIMEOUT_PER_PROBLEM_S * max(len(requests[i]["problems"]) for i in phase)
            got = drive_all(workers, [requests[i] for i in phase], timeout, answered)
            for i, reply in zip(phase, got, strict=True):
                replies[i] = reply
    finally:
        for w in workers:
            w.close()
    return replies


def _assemble(items: list[Item], replies: list, report: BundleReport) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The manifest's keys, binaries and records from the workers' replies, and the images by SHA-256. A key whose
    reply failed, or whose launch compiled otherwise than the same launch of a key before it (a compile that is not
    deterministic), is refused in `report`."""
    import hashlib

    images: dict[str, bytes] = {}
    records: dict[str, Any] = {}
    owner: dict[tuple[str, str, str], tuple[tuple[str, str], str]] = {}  # launch -> ((binary, record), its first key)
    keys = []
    for item, reply in zip(items, replies, strict=True):
        text = item.certified.key
        if not reply or reply.get("status") != "done":
            reply = reply or {}
            report.failed.append((text, f"{reply.get('status', 'crash')}: {reply.get('reason', 'no reply')}"))
            continue
        launches, new_images, new_records, conflict = [], {}, {}, ""
        for launch in reply["launches"]:
            name = _name(launch)
            image = bytes(launch["image"])
            record = json.loads(canonical(launch["record"]))
            runs = (hashlib.sha256(image).hexdigest(), record_digest(record))
            before = owner.get(name)
            if before is not None and before[0] != runs:
                conflict = f"its launch of {name[0]} compiled otherwise than the same launch of {before[1]}"
            new_images[runs[0]], new_records[runs[1]] = image, record
            launches.append(dict(zip(("identity", "source_key", "specialization"), name, strict=True)))
            launches[-1].update(binary=runs[0], record=runs[1])
        if conflict:
            report.failed.append((text, conflict))
            continue
        images.update(new_images)
        records.update(new_records)
        for launch in launches:
            owner.setdefault(_name(launch), ((launch["binary"], launch["record"]), text))
        keys.append(
            {
                "key": text,
                "kernel": item.certified.kernel,
                "dtype": item.certified.dtype,
                "config": item.config,
                "entry_digest": entry_digest(item.certified.entry),
                "launches": sorted({_name(x): x for x in launches}.values(), key=_name),
            }
        )
    keys.sort(key=lambda k: k["key"])
    return {
        "keys": keys,
        "binaries": [{"sha256": s, "size": len(images[s])} for s in sorted(images)],
        "records": [{"sha256": r, "record": records[r]} for r in sorted(records)],
    }, images


def _write(out: Path, data: bytes) -> None:
    """`out` replaced by `data` atomically, after removing what a build of it killed mid-write left."""
    from nbxcert.files import atomic_write

    for stale in out.parent.glob(f".{out.name}.*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()
    atomic_write(out, data)


# --- the worker side --------------------------------------------------------------------------------------------------
def _serve_bundle(conn, env: dict[str, str], modules: list[str]) -> None:
    """The worker's loop: cross-compile for the target its environment names, load the kernels, then answer
    `bundle` requests until the pipe closes (or, after RECYCLE_AFTER, hand over to a fresh worker)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    serve_cross_compiling(conn, env, modules, _ENV_TARGET, _answer_quietly, RECYCLE_AFTER)


def _answer_quietly(request: Mapping[str, Any], _target: Target) -> dict[str, Any]:
    """`answer`, with what the compile prints kept off the terminal: ptxas failing prints the whole PTX, and the
    reply's reason says what failed."""
    from nbxcert.worker import captured_output

    with captured_output():
        return answer(request)


class BundleWorker(Worker):
    """A worker process that cross-compiles a key's winner at its problems (`_serve_bundle`); its start, crash and
    timeout handling are `Worker`'s."""

    serve = staticmethod(_serve_bundle)


def answer(request: Mapping[str, Any]) -> dict[str, Any]:
    """(In a process cross-compiling for the target.) One key's winner launched at each of its problems: every kernel
    launch it makes, named as serving names it, with its launch record and cubin; or the failure and its reason."""
    from nbxcert.kernels import inputs, recording
    from nbxcert.kernels.backends import binaries
    from nbxcert.kernels.spec import Config, get_spec

    spec = get_spec(request["spec"])
    config = Config.from_dict(request["config"])
    dtypes = tuple(request["dtypes"])
    found: dict[tuple[str, str, str], dict[str, Any]] = {}
    for problem in request["problems"]:
        where = ",".join(f"{n}={v}" for n, v in problem.items())
        try:
            with inputs.shape_only():
                made = spec.make_inputs(problem, dtypes, int(request["seed"]), "cpu")
            with recording.recording() as rec, cross.recording() as launched:
                spec.launch(config, made)
        except Exception as exc:  # noqa: BLE001 - a compile error, or the launch refusing the problem
            failing = cross.failing_kernel(exc)
            reason = (f"{failing}: " if failing else "") + one_line(exc)
            return {"status": "failure", "reason": f"at [{where}]: {reason}"}
        paired = len(rec.launches) == len(launched)
        if not paired or any(r.kernel is not c.fn for r, c in zip(rec.launches, launched, strict=True)):
            return {
                "status": "failure",
                "reason": f"at [{where}]: the launch made {len(launched)} kernel launches through Triton and "
                f"{len(rec.launches)} through nbxcert's launch records; a bundle could not name them",
            }
        for kl, compiled in zip(rec.launches, launched, strict=True):
            identity, source_key = binaries.identity_of(kl.kernel)
            name = (identity, source_key, binaries.specialization_of(kl.kernel, kl.args, kl.kwargs))
            if name in found:
                continue
            kernel = compiled.compiled
            if kernel is None or not kernel.asm.get("cubin"):
                return {"status": "failure", "reason": f"at [{where}]: {identity} has no cubin to bundle"}
            try:
                record = binaries.describe(kernel)
            except binaries.BinaryUnusable as e:
                return {"status": "failure", "reason": f"at [{where}]: {e.message}"}
            found[name] = {
                "identity": name[0],
                "source_key": name[1],
                "specialization": name[2],
                "record": record,
                "image": bytes(kernel.asm["cubin"]),
            }
        del made
    return {"status": "done", "launches": list(found.values())}


# --- the CI gate ------------------------------------------------------------------------------------------------------
@dataclass
class CheckReport:
    """A bundle against the certificates it should hold: keys whose entry changed, that are no longer certified, and
    certified keys it does not hold."""

    bundle: str
    profile: str
    dirs: list[str]
    bundled: int
    memory_class: str | None = None  # the class's entries it was checked against (None: each key's first class's)
    changed: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)  # "key: kernel" whose code changed since the bundle was built
    sources_unchecked: str = ""  # why the kernels' code was not compared (another Triton version), if it was not

    @property
    def ok(self) -> bool:
        return not (self.changed or self.gone or self.missing or self.stale)

    def lines(self) -> list[str]:
        """One line per key that fails the check."""
        where = ", ".join(self.dirs)
        out = [f"changed: {k} (its certificate entry is not the one bundled)" for k in self.changed]
        out += [f"gone: {k} (bundled, and no longer certified in {where})" for k in self.gone]
        out += [f"missing: {k} (certified in {where}, and not in the bundle)" for k in self.missing]
        out += [f"stale: {k}'s code changed since the bundle was built (rebuild it)" for k in self.stale]
        if self.sources_unchecked:
            out.append(f"the kernels' code was not compared with the bundle's: {self.sources_unchecked}")
        return [printable(line) for line in out]

    def line(self) -> str:
        verdict = "matches its certificates" if self.ok else "does not match its certificates"
        return printable(
            f"[nbxcert] bundle {self.bundle} ({self.profile}"
            + (f", {self.memory_class} class" if self.memory_class else "")
            + f", {self.bundled} keys) {verdict} in "
            f"{', '.join(self.dirs)}: {len(self.changed)} changed, {len(self.gone)} gone, {len(self.missing)} missing, "
            f"{len(self.stale)} stale"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "bundle": self.bundle,
            "profile": self.profile,
            "dirs": self.dirs,
            "bundled": self.bundled,
            "memory_class": self.memory_class,
            "ok": self.ok,
            "changed": self.changed,
            "gone": self.gone,
            "missing": self.missing,
            "stale": self.stale,
            "sources_unchecked": self.sources_unchecked,
        }


_SOURCE_KEYS = """
import json, sys
from nbxcert.kernels.backends import binaries, cross
cross.activate(cross.Target(**json.loads(sys.argv[1])))
import importlib
modules = json.loads(sys.argv[2])
for m in modules:
    importlib.import_module(m)
from nbxcert.kernels.spec import load_all
kernels = [kernel for spec in load_all().values() for kernel in spec.kernels]
# a spec's launches may use JIT functions its `kernels` does not list (pointwise's tiled transposing kernel): every JIT
# function the kernel modules (and `modules`) define is read
for name, module in list(sys.modules.items()):
    if name.startswith("nbxcert.kernels.") or name in modules:
        kernels += [v for v in vars(module).values() if getattr(v, "__module__", None) == name]
keys = {}
for kernel in kernels:
    if hasattr(kernel, "cache_key"):
        identity, source_key = binaries.identity_of(kernel)
        keys[identity] = source_key
print(json.dumps(keys))
"""


def source_keys(target: Target, modules: Sequence[str] = ()) -> dict[str, str]:
    """identity -> Triton's source key of every kernel this nbxcert (and `modules`) registers, as a bundle names them:
    read in a process of the cross-compiling backend (where kernels are JIT functions; nothing is compiled)."""
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _SOURCE_KEYS, json.dumps(target.as_dict()), json.dumps(list(modules))],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "NBXCERT_BACKEND")},
        check=False,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise BackendUnavailable(f"reading the kernels' source keys for {target.text()} failed: {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def check(
    path: Path,
    dirs: Sequence[Path],
    keys: Sequence[Any] | None = None,
    profile_name: str | None = None,
    kernels: Sequence[str] | None = None,
    modules: Sequence[str] = (),
    memory_class: str | None = None,
) -> CheckReport:
    """Check a bundle (its integrity, every binary read) against the certificates of its profile in `dirs`: a key
    whose entry's digest differs is `changed`, a bundled key certified no more is `gone`, a certified key (of `keys`
    when given, of `kernels` when given) the bundle lacks is `missing`, and a key one of whose kernels' code changed
    since the bundle was built (its source key is not the bundled one: serving would find none of its binaries) is
    `stale`. `memory_class`: against that class's entries (a bundle built with it); None: the class its file name
    names (`<name>.<class>.nbxbundle`, as serving reads it), else each key's first class's."""
    with Bundle.open(path) as bundle:
        bundle.verify()
        manifest = bundle.manifest
    from nbxcert.profiles import get_profile

    if profile_name is not None:
        asked = get_profile(profile_name).key
        if asked != manifest["profile"]:
            raise UsageError(f"bundle {printable(path)} holds {manifest['profile']}'s winners, not {asked}'s")
    held = get_profile(manifest["profile"])
    check_class(held, memory_class)
    if memory_class is None:
        memory_class = named_class(Path(path).name, classes_of(held))
    certified = certified_entries(dirs, manifest["profile"], memory_class)
    bundled = {k["key"]: k for k in manifest["keys"]}
    report = CheckReport(str(path), manifest["profile"], [str(d) for d in dirs], len(bundled), memory_class)
    for text, k in bundled.items():
        found = certified.get(text)
        if found is None:
            report.gone.append(text)
        elif entry_digest(found.entry) != k["entry_digest"]:
            report.changed.append(text)
    if keys is None:
        expected = [t for t, c in certified.items() if not kernels or c.kernel in kernels]
    else:
        expected = [k.text() for k in keys if k.text() in certified]
    report.missing = sorted(t for t in set(expected) if t not in bundled)
    import triton

    if manifest["triton_version"] != triton.__version__:
        # Triton's source key is its own hash, which differs between its versions: only a Triton of the bundle's own
        # version (the one that serves it) can tell whether a kernel's code changed
        built_with = manifest["triton_version"]
        report.sources_unchecked = f"built with Triton {built_with}, this is Triton {triton.__version__}"
        return report
    built_for = manifest["target"]
    target = Target(built_for["backend"], built_for["arch"], built_for["warp_size"], manifest["profile"], 1)
    current = source_keys(target, modules)
    for text, k in bundled.items():
        changed = sorted({x["identity"] for x in k["launches"] if current.get(x["identity"]) != x["source_key"]})
        report.stale += [f"{text}: {identity}" for identity in changed]
    return report
