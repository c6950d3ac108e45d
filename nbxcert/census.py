"""The census: every candidate of every kernel compiled for a GPU class on a machine that does not have that GPU.

Triton compiles for any target it has a backend for (`cuda` sm_70..., `hip` gfx...) without the device, so a CPU-only
machine can check what a prune claims: every candidate it keeps must compile for the profile's target, and the
compiler's own figures (shared memory, registers per thread, threads per block) must fit the device file's limits. A
kept candidate that does not fit is a **prune defect** (the prune kept what cannot run on that device); a dropped one
that compiles and fits is an **over-prune** (an option lost; reported, failing only with `strict`), unless its binary
is the very binary of a kept candidate at the same problem (`same_code`: nothing lost).

How a candidate is compiled: census worker processes (`CensusWorker`, never in interpreter mode) run in the
cross-compiling backend (`nbxcert.kernels.backends.cross`) for the profile's target: the kernel modules are imported as
plain `JITFunction`s, Triton's active driver names the target, and every launch compiles and runs nothing. The spec's
own launch runs on CPU tensors made by the spec's own `make_inputs`, inside `cross.recording()`, so the argument types,
the 16-byte divisibility specialization and the constexprs compiled are exactly those a launch on the GPU would
compile, through Triton's own binder and on-disk cache (a rerun loads instead of compiling), and the kernels it
launched are known. Configs that lower alike share the work: each NVIDIA step after the TTGIR (LLVM IR, PTX, cubin) is
kept under the hash of its input and options, so before sm_80, where num_stages changes nothing, the five num_stages
of a tile cost one LLVM and one ptxas run, not five (the cross backend's doing).

Figures: shared memory is `metadata.shared` (Triton's figure, which its loader checks against the device). Registers
and spills are what Triton's loader reads from the driver at load time (`n_regs`, `n_spills` = local bytes / 4);
without a GPU they are read from the compiled binary: the cubin's resource usage (`cuobjdump -res-usage`, shipped with
Triton; `ptxas -v` on the PTX if that fails) or the AMDGPU metadata in the `amdgcn` assembly. Registers are checked
against min(max_registers_per_thread, max_registers_per_block / threads) where the device file states them (AMD files
do not). ptxas caps a kernel's registers at what its block allows and spills the rest, so a spill is how a register
shortage shows: a kept candidate that spills is reported (it runs, slowly; never failing), and a dropped one that
spills confirms its prune's register claim rather than being an over-prune.

What is compiled: with launch keys, each key's bucket ends (`key_problems`, smallest and largest) with the key's
dtypes, every candidate kept at both ends as the sweep does; without keys, every example problem of each spec with
every supported dtype combination. Dropped candidates are compiled too, to tell over-prunes from right refusals.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nbxcert.errors import BackendUnavailable, KernelNotFound, UsageError
from nbxcert.kernels.backends import cross
from nbxcert.kernels.backends.cross import TRITON_BACKEND, Target
from nbxcert.worker import SPAWN, Worker, WorkerGone, one_line, serve_cross_compiling

SCHEMA_VERSION = 1
SEED = 0  # inputs' values never reach the compiler; their layout (strides, alignment) does
CHUNK = 12  # candidates per worker request: inputs are made once per request, compiles spread over the workers
# Requests a census worker answers before it is replaced: Triton keeps every kernel it compiled in memory (all its
# stages' text), about 2 MB per candidate, and a census compiles thousands. A fresh worker reads its disk cache.
RECYCLE_AFTER = 25
DEFAULT_TIMEOUT_S = 300.0  # one candidate's compile on a busy CPU (ptxas on a large tile takes a minute or more)
_ENV_TARGET = "NBXCERT_CENSUS_TARGET"


# --- the target (`cross.Target`) --------------------------------------------------------------------------------------
def target_of(profile) -> Target:
    """The compile target of a GPU profile; `BackendUnavailable` when the installed Triton cannot compile for it."""
    import triton
    import triton.backends

    if profile.backend not in TRITON_BACKEND or profile.target_arch is None:
        raise UsageError(
            f"profile {profile.key} runs on the {profile.backend} backend, which compiles nothing to check",
            hint="census a GPU profile (`nbxcert profiles` lists them)",
        )
    name = TRITON_BACKEND[profile.backend]
    if name not in triton.backends.backends:
        have = ", ".join(sorted(triton.backends.backends)) or "none"
        raise BackendUnavailable(
            f"the installed Triton {triton.__version__} has no '{profile.backend}' backend ('{name}'; it has: {have}), "
            f"so it cannot compile for {profile.key}",
            hint=f"install a Triton build with the {name} backend to census {profile.key}",
        )
    sms = max((s.sm_count for s in profile.skus), default=1)
    return Target(profile.backend, profile.target_arch, int(profile.fact("warp_size")), profile.key, sms)


# --- the limits a compiled kernel must fit ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Limits:
    """The device file's limits a compiled kernel is held to; None where the file states no limit (or no fact)."""

    shared: int | None
    threads: int | None
    regs_per_thread: int | None
    regs_per_block: int | None

    @staticmethod
    def of(profile) -> Limits:
        from nbxcert.errors import DeviceFactMissing

        def fact(name: str) -> int | None:
            try:
                return profile.fact(name)
            except DeviceFactMissing:  # AMD files state no register limits (their budget trades against occupancy)
                return None

        return Limits(
            fact("max_shared_memory_per_block_optin"),
            fact("max_threads_per_block"),
            fact("max_registers_per_thread"),
            fact("max_registers_per_block"),
        )

    def register_budget(self, threads: int) -> int | None:
        if self.regs_per_thread is None:
            return None
        if self.regs_per_block is None or threads <= 0:
            return self.regs_per_thread
        return min(self.regs_per_thread, self.regs_per_block // threads)

    def exceeded(self, k: dict[str, Any]) -> list[str]:
        """What one compiled kernel's figures exceed, each naming the figure and the device-file fact."""
        over = []
        if self.shared is not None and k["shared"] > self.shared:
            over.append(f"shared {k['shared']} B > max_shared_memory_per_block_optin {self.shared}")
        if self.threads is not None and k["threads"] > self.threads:
            over.append(f"{k['threads']} threads > max_threads_per_block {self.threads}")
        budget = self.register_budget(k["threads"])
        if budget is not None and k.get("n_regs") is not None and k["n_regs"] > budget:
            over.append(
                f"{k['n_regs']} registers per thread > {budget} (min of max_registers_per_thread {self.regs_per_thread}"
                f", max_registers_per_block {self.regs_per_block} / {k['threads']} threads)"
            )
        return over


# --- the report -------------------------------------------------------------------------------------------------------
# A case's status: kept candidates end "ok", "defect" or "failure"; dropped ones "over_prune", "refused_right"
# (over a limit, as the prune said), "same_code" (it compiles to the very binary of a kept candidate at the same
# problem and dtypes: no option is lost) or "no_compile" (it does not compile or launch for this problem).
KEPT_STATUSES = ("ok", "defect", "failure")
# The device facts whose limits the compiled figures are held to (a prune reason naming one makes a checkable claim).
CHECKED_FACTS = (
    "max_shared_memory_per_block_optin",
    "max_threads_per_block",
    "max_registers_per_thread",
    "max_registers_per_block",
)
DROPPED_STATUSES = ("over_prune", "refused_right", "same_code", "no_compile")


@dataclass
class Case:
    """One candidate of one kernel at one problem and dtypes: the prune's verdict and the compiler's."""

    kernel: str
    problem: dict[str, Any]
    dtypes: tuple[str, ...]
    config: Any  # kernels.spec.Config
    kept: bool
    prune_reason: str  # why the prune dropped it ("" when kept)
    key: str | None = None  # the launch key it was compiled for, when keys were given
    status: str = ""
    reason: str = ""  # the limits exceeded, or the first line of the error
    kernels: list[dict[str, Any]] = field(default_factory=list)  # one per compiled JIT function the launch made

    @property
    def seconds(self) -> float:
        return sum(k["seconds"] for k in self.kernels)

    @property
    def spills(self) -> int:
        return max((k.get("n_spills") or 0 for k in self.kernels), default=0)

    @property
    def refutes_claim(self) -> bool:
        """An over-prune whose prune reason names a limit the compiler's figures answer (shared memory, registers,
        threads): the prune's estimate, not a policy of the kernel (idle warps, pipelining depth), lost this option."""
        return self.status == "over_prune" and any(f in self.prune_reason for f in CHECKED_FACTS)

    def figures(self) -> str:
        parts = []
        for k in self.kernels:
            regs = "?" if k.get("n_regs") is None else k["n_regs"]
            text = f"{k['name']}: shared {k['shared']} B, {regs} regs x {k['threads']} threads"
            if k.get("n_spills"):
                text += f", {k['n_spills']} spilled words"
            parts.append(text)
        return "; ".join(parts) or "no kernel launched"

    def where(self) -> str:
        problem = ",".join(f"{n}={v}" for n, v in self.problem.items())
        return f"{self.key}" if self.key else f"[{problem};{','.join(self.dtypes)}]"

    def as_dict(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "key": self.key,
            "problem": self.problem,
            "dtypes": list(self.dtypes),
            "config": self.config.as_dict(),
            "label": self.config.label(),
            "kept": self.kept,
            "prune_reason": self.prune_reason,
            "status": self.status,
            "reason": self.reason,
            "refutes_claim": self.refutes_claim,
            "kernels": self.kernels,
        }


@dataclass
class KernelSummary:
    kernel: str
    cases: int = 0
    kept: int = 0
    compiled: int = 0
    defects: int = 0
    over_prunes: int = 0
    failures: int = 0
    same_code: int = 0  # dropped cases whose binary is a kept one's (Volta's num_stages > 1: no pipeliner before sm_80)
    spilling: int = 0  # kept cases whose code spills (information: it runs)
    seconds: float = 0.0


@dataclass
class CensusReport:
    profile: str
    target: Target
    triton_version: str
    jobs: int
    strict: bool
    cases: list[Case]
    wall_seconds: float
    compiles: int  # distinct compile requests answered (after de-duplication of identical launches)

    def _with(self, status: str) -> list[Case]:
        return [c for c in self.cases if c.status == status]

    @property
    def defects(self) -> list[Case]:
        return self._with("defect")

    @property
    def failures(self) -> list[Case]:
        return self._with("failure")

    @property
    def over_prunes(self) -> list[Case]:
        return self._with("over_prune")

    @property
    def ok(self) -> bool:
        return not self.defects and not self.failures and not (self.strict and self.over_prunes)

    def over_prune_groups(self) -> list[tuple[Case, int]]:
        """Over-prunes by (kernel, config): the first case of each and how many (problem, dtypes) cases it stands for;
        those whose resource claim the compiler refutes first."""
        groups: dict[tuple, list[Case]] = {}
        for c in self.over_prunes:
            groups.setdefault((c.kernel, c.config), []).append(c)
        ordered = sorted(groups.values(), key=lambda cs: (not any(c.refutes_claim for c in cs), cs[0].kernel))
        return [(next((c for c in cs if c.refutes_claim), cs[0]), len(cs)) for cs in ordered]

    def summaries(self) -> list[KernelSummary]:
        rows: dict[str, KernelSummary] = {}
        for c in self.cases:
            s = rows.setdefault(c.kernel, KernelSummary(c.kernel))
            s.cases += 1
            s.seconds += c.seconds
            if c.kept:
                s.kept += 1
                s.compiled += c.status != "failure"
                s.spilling += c.status != "failure" and c.spills > 0
            s.defects += c.status == "defect"
            s.failures += c.status == "failure"
            s.over_prunes += c.status == "over_prune"
            s.same_code += c.status == "same_code"
        return [rows[k] for k in sorted(rows)]

    def totals(self) -> dict[str, Any]:
        keys = ("cases", "kept", "compiled", "defects", "over_prunes", "failures", "same_code", "spilling")
        out: dict[str, Any] = {k: sum(getattr(s, k) for s in self.summaries()) for k in keys}
        out["compile_seconds"] = round(sum(c.seconds for c in self.cases), 1)
        out["distinct_compiles"] = self.compiles
        return out

    def line(self) -> str:
        t = self.totals()
        refuting = sum(c.refutes_claim for c in self.over_prunes)
        return (
            f"[nbxcert] census {self.profile} ({self.target.text()}, Triton {self.triton_version}): "
            f"{t['cases']} candidates, {t['kept']} kept, {t['compiled']} compiled; prune defects {t['defects']}, "
            f"compile failures {t['failures']}, over-prunes {t['over_prunes']} ({refuting} refuting a resource "
            f"estimate); dropped with a kept one's binary {t['same_code']}; kept spilling {t['spilling']}; "
            f"{self.wall_seconds:.0f} s wall, {self.jobs} workers"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "profile": self.profile,
            "target": self.target.as_dict(),
            "triton": self.triton_version,
            "jobs": self.jobs,
            "strict": self.strict,
            "ok": self.ok,
            "wall_seconds": round(self.wall_seconds, 1),
            "totals": self.totals(),
            "kernels": [vars(s) | {"seconds": round(s.seconds, 1)} for s in self.summaries()],
            "defects": [c.as_dict() for c in self.defects],
            "failures": [c.as_dict() for c in self.failures],
            "over_prunes": [c.as_dict() for c in self.over_prunes],
            "spilling": [c.as_dict() for c in self.cases if c.kept and c.status != "failure" and c.spills],
        }


# --- planning: which candidates at which problems ---------------------------------------------------------------------
@dataclass
class _Group:
    """One (kernel, problem, dtypes): its inputs are made once per request; the configs to compile at it."""

    spec: str
    problem: dict[str, Any]
    dtypes: tuple[str, ...]
    configs: list[Any] = field(default_factory=list)
    results: dict[Any, dict[str, Any]] = field(default_factory=dict)


def _plan(specs: dict, profile, keys) -> tuple[list[Case], dict[tuple, _Group]]:
    """The cases (candidate x problem x dtypes, with the prune's verdict) and the compile groups they need."""
    from nbxcert.keys import key_problems

    cases: list[Case] = []
    groups: dict[tuple, _Group] = {}

    def add(spec, problem, dtypes, verdicts, key_text=None):
        gid = (spec.name, json.dumps(problem, sort_keys=True), tuple(dtypes))
        group = groups.setdefault(gid, _Group(spec.name, dict(problem), tuple(dtypes)))
        for config, kept, reason in verdicts:
            if config not in group.results:
                group.results[config] = {}
                group.configs.append(config)
            cases.append(Case(spec.name, dict(problem), tuple(dtypes), config, kept, reason, key_text))

    def verdicts_at(spec, problem):
        result = spec.prune(spec.candidates, problem, profile)
        dropped = dict(result.pruned)
        return [(c, c not in dropped, dropped.get(c, "")) for c in spec.candidates]

    if keys is None:
        for spec in specs.values():
            if not spec.example_problems:
                raise UsageError(
                    f"kernel {spec.name} has no example problems to compile at",
                    hint="give launch keys (--keys FILE, --workload NAME or --key TEXT)",
                )
            for problem in spec.example_problems:
                verdicts = verdicts_at(spec, problem)
                for dtypes in spec.dtypes:
                    add(spec, problem, dtypes, verdicts)
        return cases, groups
    for key in keys:
        if key.kernel not in specs:
            raise KernelNotFound(f"no kernel named '{key.kernel}' (key {key.text()}); registered: {', '.join(specs)}")
        spec = specs[key.kernel]
        problems = key_problems(spec, key, profile)
        # kept only when kept at both ends of the bucket, as the sweep keeps them (sweep.sweep_key)
        kept_small = {c for c, kept, _ in verdicts_at(spec, problems["smallest"]) if kept}
        verdicts = []
        for c, kept, reason in verdicts_at(spec, problems["largest"]):
            if kept and c not in kept_small:
                kept, reason = False, "pruned at the bucket's smallest member"
            verdicts.append((c, kept, reason))
        seen = []
        for role in ("smallest", "largest"):
            if problems[role] not in seen:
                seen.append(problems[role])
                add(spec, problems[role], key.dtypes, verdicts, key.text())
    return cases, groups


def _judge(case: Case, reply: dict[str, Any], limits: Limits) -> None:
    if reply.get("status") != "compiled":
        case.status = "failure" if case.kept else "no_compile"
        case.reason = reply.get("reason", "no reply")
        return
    case.kernels = reply["kernels"]
    over = [f"{k['name']}: {o}" for k in case.kernels for o in limits.exceeded(k)]
    if case.kept:
        case.status, case.reason = ("defect", "; ".join(over)) if over else ("ok", "")
    elif over:
        case.status, case.reason = "refused_right", "; ".join(over)
    elif "register" in case.prune_reason and case.spills:
        # ptxas caps a kernel's registers at what the block allows and spills the rest: the claim holds
        case.status, case.reason = "refused_right", f"spills {case.spills} words per thread"
    else:
        case.status, case.reason = "over_prune", ""


def _same_code_as_kept(cases: list[Case]) -> None:
    """An over-prune that compiled to the very binaries of a kept candidate at the same problem and dtypes lost no
    option: before sm_80 Triton 3.6 does not pipeline, so a config that differs only in num_stages assembles to the
    same cubin (seen for every flash-attention and matmul candidate on sm_70). Marked `same_code`, not an over-prune."""

    def at(c: Case) -> tuple:  # not `where()`: both ends of a key's bucket share its key text
        return c.kernel, json.dumps(c.problem, sort_keys=True), c.dtypes, _code_of(c)

    kept_code = {at(c) for c in cases if c.kept and c.status == "ok" and _code_of(c)}
    for c in cases:
        if c.status == "over_prune" and _code_of(c) and at(c) in kept_code:
            c.status, c.reason = "same_code", "compiles to the binary of a kept candidate"


def _code_of(case: Case) -> tuple | None:
    """The digests of a case's compiled binaries, one per kernel it launched; None when any is unknown."""
    codes = tuple(k.get("code") for k in case.kernels)
    return codes if codes and all(codes) else None


# --- running ----------------------------------------------------------------------------------------------------------
def run_census(
    profile,
    kernels: Sequence[str] | None = None,
    keys=None,
    jobs: int | None = None,
    strict: bool = False,
    modules: Sequence[str] = (),
    timeout_s: float | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> CensusReport:
    """Compile every candidate of `kernels` (default: all registered) for `profile`'s target and judge each.

    `keys`: launch keys (None: each spec's example problems with every dtype combination). `modules`: user modules
    registering their own specs, imported here and in the workers. `progress(done, total)` after each request."""
    import triton

    t0 = time.perf_counter()
    target = target_of(profile)
    specs = load_census_specs(profile, modules)
    if kernels:
        unknown = [k for k in kernels if k not in specs]
        if unknown:
            raise KernelNotFound(f"no kernel named {', '.join(map(repr, unknown))}; registered: {', '.join(specs)}")
        specs = {k: specs[k] for k in kernels}
    if keys is not None:
        keys = [k for k in keys if k.kernel in specs]
    cases, groups = _plan(specs, profile, keys)
    jobs = max(1, jobs or os.cpu_count() or 1)
    _compile_groups(list(groups.values()), target, modules, jobs, timeout_s or DEFAULT_TIMEOUT_S, progress)
    limits = Limits.of(profile)
    for case in cases:
        group = groups[(case.kernel, json.dumps(case.problem, sort_keys=True), case.dtypes)]
        _judge(case, group.results[case.config], limits)
    _same_code_as_kept(cases)
    distinct = len({k["hash"] for c in cases for k in c.kernels})
    wall = time.perf_counter() - t0
    return CensusReport(profile.key, target, triton.__version__, jobs, strict, cases, wall, distinct)


def load_census_specs(profile, modules: Sequence[str] = ()) -> dict:
    """The registry, after the user's modules, in a process that compiles nothing itself: with no backend chosen yet,
    the census takes the cross-compiling one rather than start the interpreter (or a GPU) it does not need."""
    from nbxcert.dirscan import load_specs

    cross.choose(target_of(profile), keep_chosen=True)
    return load_specs(modules)


def _compile_groups(groups: list[_Group], target: Target, modules, jobs: int, timeout_s: float, progress) -> None:
    """Answer every group's configs in `jobs` census workers; fills `group.results[config]` with each reply."""
    todo: queue.Queue = queue.Queue()
    requests = []
    for g in sorted(groups, key=lambda g: -len(g.configs)):  # the longest first: the workers finish together
        for i in range(0, len(g.configs), CHUNK):
            requests.append((g, g.configs[i : i + CHUNK]))
    total = sum(len(c) for _, c in requests)
    for r in requests:
        todo.put(r)
    done = [0]
    lock = threading.Lock()
    env = {_ENV_TARGET: json.dumps(target.as_dict())}
    workers = [CensusWorker(env, list(modules)) for _ in range(min(jobs, max(len(requests), 1)))]

    def answer(g: _Group, configs: list, replies: list[dict]) -> None:
        for c, r in zip(configs, replies, strict=False):
            g.results[c] = r
        with lock:
            done[0] += len(configs)
            if progress:
                progress(done[0], total)

    def drive(w: CensusWorker) -> None:
        while True:
            try:
                g, configs = todo.get_nowait()
            except queue.Empty:
                return
            message = {
                "op": "census",
                "spec": g.spec,
                "problem": g.problem,
                "dtypes": list(g.dtypes),
                "configs": [c.as_dict() for c in configs],
            }
            try:
                reply = w.request(message, timeout_s * len(configs))
            except WorkerGone as gone:
                if len(configs) > 1:  # find the one that hangs or kills the worker: each alone
                    for c in configs:
                        todo.put((g, [c]))
                    continue
                answer(g, configs, [{"status": gone.status, "reason": gone.detail}])
                continue
            if reply.get("status") != "done":
                reason = reply.get("reason", "no reply")
                answer(g, configs, [{"status": reply.get("status", "crash"), "reason": reason}] * len(configs))
            else:
                answer(g, configs, reply["results"])

    threads = [threading.Thread(target=drive, args=(w,), daemon=True) for w in workers]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for w in workers:
            w.close()


# --- the worker side --------------------------------------------------------------------------------------------------
class CensusWorker(Worker):
    """A worker process that cross-compiles (`_serve_census`) instead of running kernels; crash and timeout handling
    are `Worker`'s."""

    def _start(self) -> None:
        parent, child = SPAWN.Pipe()
        self.process = SPAWN.Process(target=_serve_census, args=(child, self.env, self.modules), daemon=True)
        self.process.start()
        child.close()
        self.conn = parent


def _serve_census(conn, env: dict[str, str], modules: list[str]) -> None:
    """The census worker's loop: cross-compile in this process for the target its environment names, load the
    kernels, then answer `census` requests until the pipe closes."""
    serve_cross_compiling(conn, env, modules, _ENV_TARGET, _answer, RECYCLE_AFTER)


def _answer(req: dict[str, Any], target: Target) -> dict[str, Any]:
    from nbxcert.kernels.spec import Config, get_spec

    spec = get_spec(req["spec"])
    dtypes = tuple(req["dtypes"])
    try:
        inputs = spec.make_inputs(req["problem"], dtypes, SEED, "cpu")
    except Exception as exc:  # noqa: BLE001 - the spec cannot make this problem: every candidate of it fails alike
        return {"status": "failure", "reason": f"make_inputs: {one_line(exc)}"}
    results = []
    for c in req["configs"]:
        try:
            with cross.recording() as launched:
                spec.launch(Config.from_dict(c), inputs)
        except Exception as exc:  # noqa: BLE001 - a compile error, or the launch refusing the config
            where = cross.failing_kernel(exc)  # which of the launch's kernels failed
            results.append({"status": "failure", "reason": (f"{where}: " if where else "") + one_line(exc)})
            continue
        results.append({"status": "compiled", "kernels": [_figures(launch, target) for launch in launched]})
    return {"status": "done", "results": results}


_FIGURES: dict[str, tuple[int | None, int | None]] = {}  # kernel hash -> (n_regs, n_spills), per process


def _figures(launch: cross.Launch, target: Target) -> dict[str, Any]:
    md, kernel = launch.metadata, launch.compiled
    warp = getattr(md, "warp_size", None) or target.warp_size
    h = str(md.hash)
    if h not in _FIGURES:
        _FIGURES[h] = _registers(kernel, target) if kernel is not None else (None, None)
    regs, spills = _FIGURES[h]
    binary = (kernel.asm.get("cubin") or kernel.asm.get("hsaco")) if kernel is not None else None
    return {
        "name": launch.name,
        "hash": h,
        "code": hashlib.sha256(binary).hexdigest()[:32] if binary else None,  # the binary itself, not the cache key
        "shared": int(md.shared),
        "threads": int(md.num_warps) * int(warp),
        "n_regs": regs,
        "n_spills": spills,
        "seconds": round(launch.seconds, 4),
    }


def _registers(kernel, target: Target) -> tuple[int | None, int | None]:
    """(registers per thread, spilled 32-bit words per thread) as Triton's loader would read them from the driver
    (`n_regs`, `n_spills` = local memory bytes / 4), taken from the compiled binary; (None, None) if unreadable."""
    if target.backend == "hip":
        return _amdgpu_registers(kernel.asm.get("amdgcn", ""))
    figures = _cubin_registers(kernel.asm.get("cubin"), kernel.metadata.name)
    if figures == (None, None):
        figures = _ptxas_registers(kernel.asm.get("ptx", ""), target)
    return figures


_RES_USAGE = re.compile(r"Function ([^\s:]+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)")


def _cubin_registers(cubin: bytes | None, name: str) -> tuple[int | None, int | None]:
    """`cuobjdump -res-usage` on the cubin: REG is what cuFuncGetAttribute(NUM_REGS) answers; STACK + LOCAL the local
    memory per thread (LOCAL_SIZE_BYTES), which holds the spills."""
    import subprocess
    import tempfile

    from triton import knobs

    if not cubin:
        return None, None
    try:
        tool = knobs.nvidia.cuobjdump.path
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(cubin)
            f.flush()
            text = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, timeout=120).stdout
    except Exception:  # noqa: BLE001 - no cuobjdump: the caller falls back to ptxas
        return None, None
    found = {m.group(1): (int(m.group(2)), (int(m.group(3)) + int(m.group(4))) // 4) for m in _RES_USAGE.finditer(text)}
    if not found:
        return None, None
    return found.get(name) or max(found.values())


_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame")


def _ptxas_registers(ptx: str, target: Target) -> tuple[int | None, int | None]:
    """`ptxas -v` (the one Triton ships) on the PTX, for the arch the PTX names: "Used N registers", "N bytes stack
    frame". Only a fallback: Triton's own ptxas run may use other flags (Triton 3.9 adds --regAllocOptLevel=2)."""
    import subprocess
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas

    arch = re.search(r"^\s*\.target\s+(\w+)", ptx, re.M)
    if not ptx or not arch:
        return None, None
    try:
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "k.ptx")
            with open(src, "w") as f:
                f.write(ptx)
            cmd = [get_ptxas(int(target.arch)).path, "-v", f"--gpu-name={arch.group(1)}", src, "-o", src + ".o"]
            log = subprocess.run(cmd, capture_output=True, text=True, timeout=900).stderr
    except Exception:  # noqa: BLE001 - figures unknown; shared memory is still checked
        return None, None
    regs, frame = _PTXAS_REGS.findall(log), _PTXAS_FRAME.findall(log)
    return (int(regs[-1]) if regs else None), (int(frame[-1]) // 4 if frame else None)


def _amdgpu_registers(asm: str) -> tuple[int | None, int | None]:
    """The AMDGPU metadata in the assembly: `.vgpr_count` (what hipFuncGetAttribute(NUM_REGS) answers) and
    `.private_segment_fixed_size` (scratch per lane, where spills go) / 4."""
    vgpr = re.findall(r"\.vgpr_count:\s*(\d+)", asm)
    private = re.findall(r"\.private_segment_fixed_size:\s*(\d+)", asm)
    return (int(vgpr[0]) if vgpr else None), (int(private[0]) // 4 if private else None)
