"""`nbxcert certify`: sweep every requested key on the device in force and write certificates.

The profile asked for must be the one the device in force matches (a conformance run on the CPU uses the
`cpu/interpreter` profile); keys already certified for the same card, versions and code (`nbxcert.fingerprint`) are
skipped (resumable) unless `force`; `shard=(i, n)` takes a deterministic 1/n of the keys. Each certified key is
written to its file at once, atomically and under the directory lock, so a killed run loses at most the key in flight.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import platform
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbxcert import ahead, certificates
from nbxcert._version import __version__
from nbxcert.ahead import AheadPool, compile_requests
from nbxcert.errors import ProfileMismatch, UsageError
from nbxcert.fingerprint import code_digest
from nbxcert.kernels.spec import get_spec
from nbxcert.keys import LaunchKey, check_key, check_prune
from nbxcert.profiles import get_profile
from nbxcert.sweep import SweepResult, sweep_key
from nbxcert.worker import CompilePool, Worker

DEFAULT_SEED = 20261129
# Per-candidate limits: a candidate that takes longer than this to compile or to check and time is refused as
# `timeout`. The interpreter runs kernels element by element in Python, hence its larger limit.
TIMEOUT_S = {"cuda": 120.0, "interpreter": 300.0}


@dataclass
class KeyReport:
    key: str
    status: str  # certified | skipped | failed
    winner: str = ""
    speedup_over_default: float | None = None
    counts: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    reason: str = ""


@dataclass
class CertifyReport:
    profile: str
    backend: str
    out_dir: str
    keys: list[KeyReport] = field(default_factory=list)
    # where the run's wall went outside its keys' own seconds: `plan` (the keys checked, the backend and provenance,
    # the compile pool made: the C modules its workers load built), `keys` (every key swept or skipped, its record
    # written), `close` (the workers stopped)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(k.status in ("certified", "skipped") for k in self.keys)

    def totals(self) -> dict[str, int]:
        t = {"certified": 0, "skipped": 0, "failed": 0}
        for k in self.keys:
            t[k.status] += 1
        return t


def resolve_profile(name: str):
    """The profile asked for, refused (`ProfileMismatch`) unless it is the one the device in force matches."""
    from nbxcert.kernels.backends import cuda, select

    profile = get_profile(name)
    choice = select()
    if choice.name == "interpreter":
        if profile.backend != "interpreter":
            raise ProfileMismatch(
                f"--profile {name} is a {profile.backend} profile, but this process runs on Triton's interpreter "
                f"({choice.reason}), which matches cpu/interpreter",
                hint="run on a machine whose GPU matches it, or use `--profile interpreter` for a conformance run",
            )
        return profile, "exact"
    from nbxcert.profiles import match_nvidia

    info = cuda.device_info(0)
    matched, how = match_nvidia(info.compute_capability)
    if matched.key != profile.key:
        cc = ".".join(map(str, info.compute_capability))
        raise ProfileMismatch(
            f"--profile {name} does not match this device: {info.name} (compute capability {cc}) matches "
            f"{matched.key} ({how})",
            hint=f"run `nbxcert certify --profile {matched.name} ...` (see `nbxcert doctor`)",
        )
    return profile, how


def provenance() -> dict[str, Any]:
    """Who made a certificate: card, driver, versions, date, OS."""
    import triton

    from nbxcert.kernels.backends import cuda, select

    choice = select()
    p = {
        "backend": choice.name,
        "triton": triton.__version__,
        "nbxcert": __version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "host_os": f"{platform.system()} {platform.release()}",
    }
    if choice.name == "cuda":
        from nbxcert.serving import nvidia_driver_version

        info = cuda.device_info(0)
        major, minor = cuda.driver_version()
        p.update(
            gpu=info.name,
            gpu_memory_bytes=int(info.total_memory),
            gpu_sm_count=int(info.attributes["multiprocessor_count"]),
            compute_capability=".".join(map(str, info.compute_capability)),
            driver=nvidia_driver_version(),
            cuda=f"{major}.{minor}",
        )
    else:
        p.update(gpu="none (Triton interpreter on the CPU)", gpu_memory_bytes=0, compute_capability="none")
        p.update(driver="none", cuda="none")
    return p


def memory_class(profile, prov: dict[str, Any]) -> str:
    """The memory class an entry made under `prov` is stored under (`nbxcert.memory_class`)."""
    from nbxcert.memory_class import memory_class as of_card

    return of_card(profile, prov["gpu_memory_bytes"], prov.get("gpu_sm_count"))


def same_card(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether a stored certification was made on the same card, driver and Triton with the same code (then a rerun
    skips it)."""
    return all(a.get(f) == b.get(f) for f in certificates.CARD_FIELDS) and same_code(a, b)


def same_code(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two provenances name the same code: the same `code` digest (`nbxcert.fingerprint`) when both hold one,
    else the same nbxcert version."""
    field = "code" if "code" in a and "code" in b else "nbxcert"
    return a.get(field) == b.get(field)


def older_code(profile, entries: dict[str, dict], keys) -> list[str]:
    """The texts of `keys` (LaunchKeys) whose entry in `entries` was made by code that has changed since: a `certify`
    of them sweeps them again (until then they are served as they are)."""
    from nbxcert import __version__
    from nbxcert.kernels.spec import get_spec

    now: dict[str, dict[str, str]] = {}
    older = []
    for k in keys:
        entry = entries.get(k.text())
        if entry is None:
            continue
        if k.kernel not in now:
            now[k.kernel] = {"code": code_digest(get_spec(k.kernel), profile), "nbxcert": __version__}
        if not same_code(entry.get("provenance", {}), now[k.kernel]):
            older.append(k.text())
    return older


def _shard_order(key: LaunchKey) -> tuple[int, str]:
    """A key's place in the order shards are dealt from: its text's SHA-256 (so a shard is a spread of kernels and
    sizes, not a run of one family), then its text."""
    return int.from_bytes(hashlib.sha256(key.text().encode()).digest()[:8], "big"), key.text()


def parse_shard(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    hint = "shards are numbered from 0: --shard 0/4, 1/4, 2/4 and 3/4 together cover every key"
    m = re.fullmatch(r"([0-9]+)/([0-9]+)", text.strip())  # ASCII digits: int() also reads '٣' and ' 1_0'
    if not m:
        raise UsageError(f"--shard {text!r} is not i/n, two whole numbers", hint=hint)
    if max(len(m.group(1)), len(m.group(2))) > 9:  # was "is not i/n", though it is
        raise UsageError(f"--shard {text!r}: a shard count of at most 999999999", hint=hint)
    i, n = int(m.group(1)), int(m.group(2))
    if n < 1 or not 0 <= i < n:
        raise UsageError(f"--shard {text!r}: need 0 <= i < n", hint=hint)
    return (i, n)


def shard_keys(keys: Sequence[LaunchKey], shard: tuple[int, int] | None) -> list[LaunchKey]:
    """The keys of share `shard` = (i, n), in their order: the keys dealt out in turn in `_shard_order`, the i-th of
    every n to share i, so the n shares of the same keys (every shard of one run forms them alike) cover each key once
    and differ in size by one at most. Each key's share by its digest alone left shares empty and others twice their
    size (sd-unet-block's 32 keys over 8: 0 to 11). A share that holds none of them (more shares than keys) is refused:
    a shard that did nothing must not pass as one that did its share."""
    if shard is None:
        return list(keys)
    i, n = shard
    texts = {k.text() for k in sorted(keys, key=_shard_order)[i::n]}
    share = [k for k in keys if k.text() in texts]
    if keys and not share:
        raise UsageError(
            f"--shard {i}/{n} holds none of the {len(keys)} keys asked for",
            hint=f"use at most {len(keys)} shards, one a key at least, or ask for more keys",
        )
    return share


def keys_ahead(n: int) -> int:
    """`--ahead`: how many keys' compiles a certify run keeps queued ahead of the key on the GPU, 0 or more."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise UsageError(
            f"--ahead {n} is not a count of keys",
            hint=f"give 0 (each key compiles when its turn comes) or more; the default is {ahead.AHEAD_KEYS}",
        )
    return n


def check_out_dir(out_dir: Path | None) -> Path:
    """Where certify may write: only a directory `--out` names (with no default, a certify run from a checkout wrote
    into the shipped `certificates/`), a directory that exists or can be made, and can be written."""
    from nbxcert.options import writable_dir

    if out_dir is None:
        raise UsageError(
            "certify writes certificates only where --out says, and --out is not given",
            hint="give --out DIR (e.g. --out ./certs); files go to DIR/<vendor>/<profile>/",
        )
    return writable_dir(Path(out_dir), "--out")


def entry_of(result: SweepResult, spec, profile, prov, seed: int) -> dict[str, Any]:
    w, r, d = result.winner, result.runner_up, result.default

    def role(o):
        # winner, runner-up and default are always fully timed (`sweep.finalists`)
        return {"config": o.config.as_dict(), "timing": o.timing} if o is not None and o.timing else None

    return {
        "winner": role(w),
        "runner_up": role(r),
        "margin": result.margin,
        "default": role(d) if d is not None and d.status == "correct" else None,
        "error": dict(w.error),
        "counts": result.counts(),
        "reproducible": bool(result.reproducible),
        "memory_class": memory_class(profile, prov),
        "seed": seed,
        "oracle": spec.oracle_name,
        "provenance": prov,
        "certified_problems": result.problems,
        "refused": [
            {"config": o.config.as_dict(), "status": o.status, "reason": summarize_reason(o.reason)}
            for o in result.outcomes
            if o.status != "correct"
        ],
        # every candidate timed at the full budget, fastest first: what the winner was chosen from, so the choice can
        # be audited, and a change of the winner rule applied to a certificate without sweeping its key again
        "finalists": [
            {"config": o.config.as_dict(), "timing": o.timing}
            for o in sorted(result.outcomes, key=lambda o: o.median)
            if o.status == "correct" and o.phase == "final" and o.timing
        ],
    }


def summarize_reason(reason: str) -> str:
    """One line of a refusal's reason for the certificate (a mismatch report's counts and worst error)."""
    lines = [x.strip() for x in reason.splitlines() if x.strip()]
    keep = [x for x in lines if x.startswith(("Mismatched", "Max scaled"))] or lines[:1]
    return " ".join(keep)[:300]


def certify(
    profile_name: str,
    keys: Sequence[LaunchKey],
    out_dir: Path,
    force: bool = False,
    shard: tuple[int, int] | None = None,
    jobs: int | None = None,
    seed: int = DEFAULT_SEED,
    modules: Sequence[str] = (),
    progress: Callable[[str], None] | None = None,
    on_key: Callable[[KeyReport], None] | None = None,
    timeout_s: float | None = None,
    ahead_keys: int | None = None,
) -> CertifyReport:
    from nbxcert.kernels.backends import select
    from nbxcert.options import jobs as check_jobs
    from nbxcert.options import seconds

    t_start = time.perf_counter()
    # every input checked before a worker starts or a file is written
    profile, _how = resolve_profile(profile_name)
    out_dir = check_out_dir(out_dir)
    if not keys:
        raise UsageError("no keys to certify", hint="give --workload NAME|FILE, --keys FILE or --key TEXT")
    specs = {k.kernel: get_spec(k.kernel) for k in keys}
    for k in keys:
        check_prune(specs[k.kernel], check_key(specs[k.kernel], k, profile), profile)
    todo = shard_keys(keys, shard)
    jobs, timeout_s = check_jobs(jobs), seconds(timeout_s)
    depth = ahead.AHEAD_KEYS if ahead_keys is None else keys_ahead(ahead_keys)
    choice = select()
    prov = provenance()
    report = CertifyReport(profile.key, choice.name, str(out_dir))
    env = {"NBXCERT_BACKEND": choice.name}
    if choice.name == "interpreter":
        env["TRITON_INTERPRET"] = "1"
    # one runner on a GPU (timings must not overlap); one per core under the interpreter (CPU timings, recorded as such)
    n_runners = 1 if choice.name == "cuda" else (jobs or os.cpu_count() or 1)
    runners = [Worker(env, list(modules)) for _ in range(n_runners)]
    pool = compile_pool(choice.name, env, list(modules), jobs or os.cpu_count() or 1)
    timeout_s = timeout_s or TIMEOUT_S[choice.name]
    # the next keys' candidates compile while this key's are checked and timed on the GPU (`nbxcert.ahead`)
    compiler = AheadPool(pool, timeout_s) if pool is not None else None

    def made_by(spec) -> dict:
        return dict(prov, code=code_digest(spec, profile))

    # the out directory's files read once, and again only when another process writes them (`Directory`)
    written = certificates.Directory(out_dir)

    # this card's memory class: a key's entry of another class is kept beside the one certified here
    card_class = memory_class(profile, prov)

    def done_before(key: LaunchKey) -> bool:
        spec = specs[key.kernel]
        out_dtype = spec.output_dtypes(key.dtypes)[0]
        old = written.existing_entry(profile.key, key.kernel, out_dtype, key.text(), card_class)
        return old is not None and not force and same_card(old["provenance"], made_by(spec))

    queued: set[int] = set()  # the keys (indices into todo) whose compiles were queued ahead

    def compile_next(after: int) -> None:
        """Queue the compiles of the next `depth` keys to sweep after `todo[after]`, those not queued yet."""
        assert compiler is not None
        count = 0
        for j in range(after + 1, len(todo)):
            if count >= depth:
                break
            if done_before(todo[j]):
                continue
            count += 1
            if j not in queued:
                queued.add(j)
                compiler.submit(compile_requests(specs[todo[j].kernel], todo[j], profile, seed))

    t_keys = time.perf_counter()
    report.seconds["plan"] = t_keys - t_start
    try:
        for i, key in enumerate(todo):
            spec = specs[key.kernel]
            out_dtype = spec.output_dtypes(key.dtypes)[0]
            if done_before(key):
                kr = KeyReport(key.text(), "skipped", reason="already certified for this card, versions and code")
            else:
                if compiler is not None:
                    compiler.after_compile = lambda i=i: compile_next(i)
                result = sweep_key(spec, key, profile, runners, compiler, seed, timeout_s, progress)
                kr = _key_report(result)
                if result.winner is not None:
                    entry = entry_of(result, spec, profile, made_by(spec), seed)
                    kr.reason = beside_classes(
                        written.existing_entry(profile.key, key.kernel, out_dtype, key.text()), entry
                    )
                    written.add_entry(profile.key, key.kernel, out_dtype, key.text(), entry)
            report.keys.append(kr)
            if on_key:
                on_key(kr)
    except BaseException:
        # interrupted (or failed): workers may be mid-candidate; stop them now rather than wait for each to finish
        for r in runners:
            r.kill()
        if compiler is not None:
            compiler.kill()
        # the threads that drove the runners may still be inside a request: each finds its worker gone (its pipe is
        # left to it), and the runners are tidied one by one; the pool's once its thread has ended
        for r in runners:
            r.close()
        if compiler is not None:
            compiler.close()
        raise
    t_close = time.perf_counter()
    report.seconds["keys"] = t_close - t_keys
    if compiler is not None:
        compiler.close(also=runners)
    else:
        ahead.close_together(runners)
    report.seconds["close"] = time.perf_counter() - t_close
    return report


def beside_classes(old: dict | None, new: dict) -> str:
    """What a key's line says when the key keeps entries of other memory classes beside the new one (serving reads
    its card's class: an H200 keeps its entry when an H100 certifies the key); "" otherwise."""
    others = sorted(c for c in (certificates.class_entries(old) if old else {}) if c != new["memory_class"])
    return f"kept beside the {', '.join(others)} class's entry" if others else ""


def compile_pool(backend: str, env: dict[str, str], modules: list[str], jobs: int) -> CompilePool | None:
    """The compile workers of a certify run: on the GPU only (the interpreter compiles nothing). Each allocates a
    key's shape-only inputs and frees them before the next key's; it keeps no freed block aside for a size it will not
    ask again (COMPILE_WORKER_ENV), so sixteen workers that met a 7B model's largest keys do not hold the device's
    memory that the runner's checks need."""
    return ahead.cuda_pool({**env, **COMPILE_WORKER_ENV}, modules, jobs, CompilePool) if backend == "cuda" else None


# What a compile worker's environment adds to the run's: freed blocks go back to its pool (`memory.kept_per_size`).
COMPILE_WORKER_ENV = {"NBXCERT_MEMORY_KEPT_PER_SIZE": "0"}


def _key_report(result: SweepResult) -> KeyReport:
    counts = result.counts()
    if result.winner is None:
        reasons = sorted({f"{o.status}: {o.reason.splitlines()[0][:160]}" for o in result.outcomes if o.reason})
        return KeyReport(
            result.key.text(), "failed", counts=counts, seconds=result.seconds, reason="; ".join(reasons[:3])
        )
    speedup = None
    if result.default is not None and result.default.timing:
        speedup = result.default.median / result.winner.median
    return KeyReport(
        result.key.text(),
        "certified",
        winner=result.winner.config.label(),
        speedup_over_default=speedup,
        counts=counts,
        seconds=result.seconds,
    )
