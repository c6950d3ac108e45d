"""`nbxcert export`: certified configs written as the files tools people already run read, so a certification serves
an application that never imports nbxcert.

    nbxcert export --format vllm-fused-moe --profile hopper --dir certs --out tuned/
    nbxcert export --format triton-autotune --profile hopper --dir certs --spec mypkg.kernels --out triton-cache/

`vllm-fused-moe` (`export_vllm`): vLLM's tuned fused-MoE config files, for `VLLM_TUNED_CONFIG_FOLDER` (or vLLM's own
`model_executor/layers/fused_moe/configs/`). One file per (E, N, device name[, dtype]), named as vLLM's
`get_config_file_name` names it, `E={E},N={N},device_name={device_name}{dtype_selector}{block_shape_selector}.json`,
each an object mapping M (the token count, as a string) to `{"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K",
"GROUP_SIZE_M", "num_warps", "num_stages"}` (ints), Ms in increasing order, four-space indent, as vLLM's
`benchmarks/kernels/benchmark_moe.py` writes them (without its `"triton_version"` entry: a vLLM that predates it reads
every key of the file as an M and fails on that one). vLLM picks the entry of the M nearest a batch's token count.

    E            the key's `experts`.
    N            vLLM's N is `w2.shape[2]`, the intermediate size of one expert (of one tensor-parallel shard): w1 is
                 [E, 2N, hidden] (gate and up stacked), w2 [E, hidden, N]. nbxcert's fused_moe W is [E, N, K], so the
                 gate/up projection's key (one A row per token, `pair_rows` 0, no router weight, `mul_weight` 0) has
                 N = 2·intermediate and vLLM's N is its N / 2; the down projection's key (one row per (token, expert)
                 pair, `pair_rows` 1, or with top_k = 1 `mul_weight` 1) has K = intermediate: vLLM's N is its K. Both
                 as nbxcert's workloads form them for gated (SwiGLU) experts (`nbxcert.workload`). A key with token
                 rows and router weights at top_k > 1 is no launch vLLM makes: it is skipped, with that reason.
    device_name  the provenance's GPU name (what the driver calls the card, as `torch.cuda.get_device_name()` does)
                 with spaces as underscores; a card of the H200 family is `NVIDIA_H200`, as vLLM renames it
                 (`NVIDIA H200 NVL` included). Entries made on different cards go to different files.
    dtype        float16 and bfloat16 take no selector (vLLM's `_get_config_dtype_str` gives None for both), so both
                 dtypes' keys land in one file; float32 is `,dtype=float32`. nbxcert certifies no quantized fused_moe
                 (vLLM's `fp8_w8a8`, `int8_w8a16`, ... selectors), nor block-quantized shapes (no block selector).
    M            the key's M, the upper end of its bucket on the `tokens` ladder (the size its timing was taken at).

vLLM runs one config for both projections of a layer (and its `moe_align_block_size` block is that config's
BLOCK_SIZE_M), and the fp16 and bf16 layers of one shape read the same file. So the config written for an M is the
certified winner when every key landing there (gate/up and down, each dtype) certified the same one; otherwise the
config with the least total median over those keys among the configs each of them timed in full (winner, runner-up,
default, finalists: each correct for its key), ties to the simpler label. An M where no config was timed for all of
them, or where their timings were taken differently, is left out, with the reason.

The configs are nbxcert's fused_moe kernel's (`nbxcert.kernels.moe`: its BLOCK_M/BLOCK_N/BLOCK_K/GROUP_M tile the
aligned token layout and the expert weights as vLLM's BLOCK_SIZE_* do); vLLM launches its own kernel with them.

`triton-autotune` (`export_triton`): what `triton.autotune(..., cache_results=True)` reads back instead of
benchmarking, for each certified key of a kernel declared with `nbxcert.autotune` (`nbxcert.dropin`; `--spec MODULE`
imports it). Triton's `Autotuner.check_disk_cache` names the file `<TRITON_CACHE_DIR>/<dir>/<name>.autotune.json`
(`<name>`: the JIT function's name, cut at 150 characters), `<dir>` the unpadded base32 of a SHA-256 over, joined by
"-": `triton_key()` (a digest of the installed Triton's own files), the backend's hash for the GPU target (CUDA: the
ptxas version and the arch), the JIT function's `cache_key` (its source and what it calls), the sorted
cache-invalidating environment variables, `str()` of the tuning key, and `str()` of each config in the list the
autotuner benchmarks. It reads `{"key": [...], "configs_timings": [[config.__dict__, timings], ...]}` and takes the
config of the smallest timings. `autotune_cache_key` computes that digest exactly as Triton 3.6's and 3.9's
`check_disk_cache` do (the Tritons whose cache this writes: another version is refused by name), from:

    tuning key   what `Autotuner.run` forms: the `key=` arguments' values (the certified key's values; a bucketed
                 field's is its rung, and Triton keys by the exact value, so only a launch of that size finds it), then
                 `str(arg.dtype)` of every argument that has a dtype, in argument order: `torch.<dtype>` (torch
                 tensors passed positionally). Without `dtype_args` the key's dtypes are every tensor's, in that
                 order; with `dtype_args` (which may name fewer tensors than the launch passes) they are those of the
                 certified launch, the spec's `make_inputs` for the entry's smallest certified problem (shapes only),
                 its `dtype_args` tensors checked against the key's dtypes. A key whose launch cannot be made again,
                 or whose tensors disagree with it, is skipped, with the reason.
    configs      the kernel's `triton.Config` list as given to `nbxcert.autotune` (its `configs`), in its order:
                 what Triton hashes when `triton.autotune` is given the same list (where the kernel keeps no such
                 list, one made of its candidates: kwargs in name order, num_ctas 1). A list given otherwise (another
                 order, another kwargs order, other configs) hashes otherwise: Triton then finds no file and
                 benchmarks, as it would without one; it never reads another list's choice. Skipped, with the reason:
                 a kernel with `prune_configs_by` (the pruned list Triton hashes depends on each run's arguments),
                 one whose configs have a `pre_hook` (Triton keeps no cache for them), one with a single config
                 (Triton never tunes it).
    target, env  the profile's GPU target, and the environment of this process: export where the application runs,
                 with the same Triton install, ptxas and Triton variables (the manifest lists them).

Each file lists the certified winner first, with its median in ms (`[median]`: a certificate keeps the median, minimum
and 20-80% spread, not Triton's own p50/p20/p80 triple; Triton compares the lists), then the configs its entry timed in
full that were slower; a finalist timed no slower that the winner rule set aside is left out, so Triton's minimum is
the certified winner. `autotune_manifest.json` (beside the cache directories) maps each file to its nbxcert key, tuning
key, hashed configs, winner and certificate, and records the Triton version, the digest of `triton_key()`, the target,
the backend hash and the environment the names were computed with. Use the directory as `TRITON_CACHE_DIR`, or copy
its directories into Triton's cache (a `TRITON_CACHE_MANAGER` of another kind reads elsewhere).

Certificates are read through `dirscan.scan_dir` with every kernel's spec: a problem in a file this export reads
refuses it (`CertificateInvalid`); problems elsewhere in the directory do not. A key certified in several `--dir`s is
taken from the first, each memory class's entry of it from the first that holds one of that class (as serving takes
it on a card of the class). Files written replace files of the same name; nothing else under `--out` is touched.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbxcert.errors import BackendUnavailable, CertificateInvalid, KeyNotCertified, UsageError
from nbxcert.files import atomic_write
from nbxcert.keys import parse_key
from nbxcert.text import printable

FORMATS = ("vllm-fused-moe", "triton-autotune")
MANIFEST = "autotune_manifest.json"
MANIFEST_SCHEMA = 1


@dataclass(frozen=True)
class Written:
    """One file written: its path under `--out`, the certified keys it was made from, and per item (an M, a tuning
    key) what was written and why."""

    path: str
    keys: tuple[str, ...]
    items: dict[str, Any]
    summary: str


@dataclass(frozen=True)
class Skipped:
    """A certified key that went into no file, and why."""

    key: str
    reason: str


@dataclass
class ExportReport:
    format: str
    profile: str
    out: Path
    dirs: list[str]
    entries: int = 0
    written: list[Written] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    def line(self) -> str:
        files = f"{len(self.written)} file{'' if len(self.written) == 1 else 's'}"
        return (
            f"export {self.format} {self.profile}: {files} written under {self.out} from {self.entries} certified "
            f"keys; {len(self.skipped)} skipped"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "profile": self.profile,
            "out": str(self.out),
            "dirs": self.dirs,
            "entries": self.entries,
            "written": [{"file": w.path, "keys": list(w.keys), "items": w.items} for w in self.written],
            "skipped": [{"key": s.key, "reason": s.reason} for s in self.skipped],
        }


# --- the command ------------------------------------------------------------------------------------------------------
def export(
    fmt: str,
    profile_name: str,
    dirs: Sequence[Path],
    out: Path,
    kernels: str | None = None,
    modules: Sequence[str] = (),
) -> ExportReport:
    """`nbxcert export`: the certified entries of `profile_name` in `dirs` (default: serving's search path), of the
    format's kernels (only `kernels`, comma-separated, when given), written under `out` as `fmt` reads them."""
    from nbxcert.options import check_environment, existing_dirs, writable_dir
    from nbxcert.profiles import get_profile

    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r} is not an export format", hint=f"choose one of: {', '.join(FORMATS)}")
    if fmt == "triton-autotune":
        check_triton()
    prof = get_profile(profile_name)
    if prof.backend not in ("cuda", "hip"):
        raise UsageError(
            f"profile {prof.key} certifies conformance under Triton's interpreter; {fmt} is read on a GPU",
            hint="export a GPU profile's certificates (`nbxcert profiles` lists them)",
        )
    writable_dir(out, "--out")
    dirs = existing_dirs(list(dirs)) if dirs else None
    check_environment(search_path=dirs is None)
    if dirs is None:
        from nbxcert.serving import search_path

        dirs = search_path()
    specs = _load_specs(prof, modules)
    report = ExportReport(fmt, prof.key, Path(out), [str(d) for d in dirs])
    if fmt == "vllm-fused-moe":
        wanted = _wanted(kernels, ("fused_moe",), fmt)
        found = certified(dirs, prof.key, wanted, specs)
        _none_left(found, prof.key, dirs, wanted, "--kernels fused_moe --workload mixtral-8x7b")
        report.entries = len(found)
        export_vllm(found, Path(out), report)
    else:
        users = user_kernels(specs)
        wanted = _wanted(kernels, tuple(users), fmt)
        found = certified(dirs, prof.key, wanted, specs)
        _none_left(found, prof.key, dirs, wanted, "--spec MODULE --key 'KEY'")
        report.entries = len(found)
        export_triton(found, {n: users[n] for n in wanted}, prof, Path(out), report)
    if not report.written:
        first = report.skipped[0]
        raise UsageError(
            f"none of the {report.entries} certified keys can be written as {fmt}; {first.key}: {first.reason}",
            hint=f"`nbxcert export ... --json` lists the reason of each of the {len(report.skipped)}",
        )
    return report


def _load_specs(profile, modules: Sequence[str]) -> dict[str, Any]:
    """Every registered spec (the user's modules first), with the cross-compiling backend fixed unless one is in force:
    kernel modules import as compiled-mode JIT functions (whose `cache_key` Triton's autotuner hashes) and nothing is
    launched or compiled."""
    from nbxcert.census import load_census_specs

    return load_census_specs(profile, modules)


def _wanted(kernels: str | None, exportable: Sequence[str], fmt: str) -> list[str]:
    from nbxcert.keyfile import parse_kernels

    names = parse_kernels(kernels)
    if names is None:
        if not exportable:
            raise UsageError(
                f"{fmt} exports kernels declared with nbxcert.autotune, and none is registered",
                hint="import the module declaring yours with --spec MODULE",
            )
        return list(exportable)
    other = [n for n in names if n not in exportable]
    if other:
        what = ", ".join(exportable) or "none registered: import yours with --spec MODULE"
        raise UsageError(
            f"--kernels {other[0]}: {fmt} exports only {what}",
            hint=f"leave --kernels out to export every kernel {fmt} takes",
        )
    return names


def _none_left(found, profile_key: str, dirs, wanted, certify_args: str) -> None:
    if not found:
        where = ", ".join(printable(d) for d in dirs)
        raise KeyNotCertified(
            f"no certified {', '.join(wanted)} entries for {profile_key} in {where}",
            hint=f"certify them first: `nbxcert certify --profile {profile_key} {certify_args} --out DIR`, then "
            "export with --dir DIR",
        )


# --- reading the certificates -----------------------------------------------------------------------------------------
def certified(dirs: Sequence[Path], profile_key: str, kernels: Sequence[str], specs: Mapping[str, Any]) -> list:
    """The valid entries (`dirscan.Found`) of `kernels` for `profile_key`, a key in several directories taken from
    the first; each memory class's entry of it from the first directory holding one of that class, as serving takes
    it for a card of the class (a class only a later directory holds is added under the entry's `other_classes`;
    the `Found`'s file stays the first one's). `CertificateInvalid` when a file of those kernels and that profile has
    a problem."""
    from dataclasses import replace

    from nbxcert.certificates import class_entries, with_class
    from nbxcert.dirscan import scan_dir

    chosen: dict[str, Any] = {}
    for d in dirs:
        scan = scan_dir(d, specs)
        mine = [p for p in scan.problems if _concerns(p.file, Path(d), profile_key, kernels)]
        if mine:
            raise CertificateInvalid(
                f"{printable(d)} has {len(mine)} problem(s) in the files this export reads; "
                f"the first: {mine[0].line()}",
                hint=f"run `nbxcert validate {printable(d)}` to list every problem",
            )
        for (p, _file, key), found in sorted(scan.found.items()):
            if p != profile_key or found.kernel not in kernels:
                continue
            if key not in chosen:
                chosen[key] = found
                continue
            held = class_entries(chosen[key].entry)
            for cls, entry in class_entries(found.entry).items():
                if cls not in held:
                    chosen[key] = replace(chosen[key], entry=with_class(chosen[key].entry, entry))
    return [chosen[k] for k in sorted(chosen)]


def _concerns(file: str, root: Path, profile_key: str, kernels: Sequence[str]) -> bool:
    """Whether a problem's file is one this export reads: the profile's directory, or a file of one of `kernels`."""
    try:
        parts = Path(file).relative_to(root).parts
    except ValueError:
        return False
    if "/".join(parts[:2]) != profile_key:
        return False
    return len(parts) < 3 or parts[2].split(".")[0] in kernels


def timed_configs(entry: Mapping[str, Any]) -> dict:
    """Every config an entry timed at the full budget ({Config: timing}): winner, runner-up, default, finalists. Each
    was correct for the entry's key."""
    from nbxcert.kernels.spec import Config

    roles = [entry["winner"], entry["runner_up"], entry["default"], *(entry.get("finalists") or ())]
    out: dict = {}
    for r in roles:
        if r is not None:
            out.setdefault(Config.from_dict(r["config"]), r["timing"])
    return out


# --- vLLM's fused-MoE config files ------------------------------------------------------------------------------------
VLLM_CONFIG_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
_VLLM_TILE = {
    "BLOCK_SIZE_M": "BLOCK_M",
    "BLOCK_SIZE_N": "BLOCK_N",
    "BLOCK_SIZE_K": "BLOCK_K",
    "GROUP_SIZE_M": "GROUP_M",
}
# nbxcert's activation dtype -> vLLM's dtype selector (`_get_config_dtype_str`: None for fp16/bf16, "float32" for fp32)
_VLLM_DTYPE = {"float16": None, "bfloat16": None, "float32": "float32"}
_DEVICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.()+-]*\Z")  # what a driver's card name holds: no path, no `,` `=`


def vllm_device_name(gpu: str) -> str:
    """The device name vLLM puts in a config file's name for a card: spaces as underscores, the H200 family as
    `NVIDIA_H200` (vLLM's `get_config_file_name`)."""
    name = gpu.replace(" ", "_")
    if "H200" in name.split("_"):
        return "NVIDIA_H200"
    return name


def vllm_file_name(experts: int, n: int, device_name: str, dtype: str | None = None, block_shape=None) -> str:
    """vLLM's `get_config_file_name(E, N, dtype, block_shape)` for a device name already made (`vllm_device_name`)."""
    dtype_selector = "" if not dtype else f",dtype={dtype}"
    block_shape_selector = ("" if not block_shape or not all(block_shape) else f",block_shape={block_shape}").replace(
        " ", ""
    )
    return f"E={experts},N={n},device_name={device_name}{dtype_selector}{block_shape_selector}.json"


def vllm_n(values: Mapping[str, Any]) -> tuple[str, int]:
    """(the projection, vLLM's N) of a fused_moe key's fields; `UsageError` for a key vLLM's fused MoE never launches
    (see the module docstring for the mapping)."""
    n, k, top_k = values["N"], values["K"], values["top_k"]
    if values["pair_rows"] == 1 or (values["mul_weight"] == 1 and top_k == 1):
        return "down", k
    if values["mul_weight"] == 0:
        if n % 2:
            raise UsageError(f"N={n} is odd: no gate/up projection (w1 is [E, 2·intermediate, hidden]) has it")
        return "gate_up", n // 2
    raise UsageError(
        f"token rows with router weights at top_k={top_k}: vLLM applies router weights on the input only at top_k 1"
    )


def vllm_config(config) -> dict[str, int]:
    """A fused_moe `Config` as vLLM's config dict (its keys, in the order its tuned files list them)."""
    p = config.params
    tiles = {v: int(p[n]) for v, n in _VLLM_TILE.items()}
    return {**tiles, "num_warps": int(config.num_warps), "num_stages": int(config.num_stages)}


def one_config(founds: Sequence[Any]) -> tuple[Any, str]:
    """(the config, why) to write for the keys landing on one M of one file, or (None, why not): see the module
    docstring."""
    from nbxcert.kernels.spec import Config

    winners = {Config.from_dict(f.entry["winner"]["config"]) for f in founds}
    if len(winners) == 1:
        return next(iter(winners)), "the certified winner" + (" of every key" if len(founds) > 1 else "")
    timed = [timed_configs(f.entry) for f in founds]
    kinds = sorted({t["kind"] for tt in timed for t in tt.values()})
    if len(kinds) > 1:
        return None, f"their timings were taken differently ({', '.join(kinds)}): no total to compare"
    common = set(timed[0]).intersection(*timed[1:])
    if not common:
        return None, "no config was timed in full for every one of them (vLLM runs one config for all)"
    best = min(common, key=lambda c: (sum(t[c]["median_us"] for t in timed), c.label()))
    total = sum(t[best]["median_us"] for t in timed)
    return best, f"the least total median over the {len(founds)} keys ({total:.4g} us) among the configs all timed"


def export_vllm(found: Sequence[Any], out: Path, report: ExportReport) -> None:
    """Write vLLM's fused-MoE config files of `found` (fused_moe entries) under `out`; into `report`. Each memory
    class's entry of a key is its card's (vLLM names its files by device): every class's is written, not the first
    one's alone."""
    from nbxcert.dirscan import each_class

    slots: dict[str, dict[int, list]] = {}
    for f in [c for g in found for c in each_class(g)]:
        key = parse_key(f.key)
        values = key.values
        try:
            _projection, n = vllm_n(values)
        except UsageError as e:
            report.skipped.append(Skipped(f.key, e.message))
            continue
        act = key.dtypes[0]
        if act not in _VLLM_DTYPE:
            reason = f"vLLM names no tuned config for {act} activations (its dtype selectors name quantization schemes)"
            report.skipped.append(Skipped(f.key, reason))
            continue
        device = vllm_device_name(f.entry["provenance"]["gpu"])
        if not _DEVICE_NAME.match(device):
            report.skipped.append(Skipped(f.key, f"GPU name {device!r} cannot be part of a file name"))
            continue
        name = vllm_file_name(values["experts"], n, device, _VLLM_DTYPE[act])
        slots.setdefault(name, {}).setdefault(values["M"], []).append(f)
    for name in sorted(slots):
        configs: dict[str, dict[str, int]] = {}
        items: dict[str, Any] = {}
        used: list[str] = []
        for m in sorted(slots[name]):
            founds = slots[name][m]
            config, why = one_config(founds)
            if config is None:
                report.skipped.extend(Skipped(f.key, f"M={m} of {name}: {why}") for f in founds)
                continue
            configs[str(m)] = vllm_config(config)
            items[str(m)] = {"config": configs[str(m)], "keys": [f.key for f in founds], "why": why}
            used.extend(f.key for f in founds)
        if not configs:
            continue
        atomic_write(out / name, json.dumps(configs, indent=4) + "\n", make_parents=True)
        report.written.append(Written(name, tuple(used), items, "M " + ", ".join(configs)))


# --- Triton's autotune cache ------------------------------------------------------------------------------------------
# The Triton versions (major, minor) whose autotuner cache this writes: their `Autotuner.check_disk_cache` and `Config`
# were read, and the cache key reproduced (`autotune_cache_key`) and read back by that version's own autotuner
# (tests/cli/test_export.py, run under each). 3.6 and 3.9 hash the same parts; 3.6's `str(Config)` has no ir_override.
TRITON_CACHE_VERSIONS = ((3, 6), (3, 9))
DTYPE_PREFIX = "torch."  # `str(arg.dtype)` of a torch tensor argument: what Triton's tuning key holds


def check_triton(version: str | None = None) -> str:
    """The installed Triton's version (or `version`), when its autotune cache is one this writes; `UsageError` naming
    both versions otherwise, and when Triton interprets kernels (no autotune cache is kept then)."""
    import triton

    version = version or triton.__version__
    parts = tuple(int(x) for x in re.findall(r"\d+", version)[:2])
    if parts not in TRITON_CACHE_VERSIONS:
        known = ", ".join(f"{a}.{b}" for a, b in TRITON_CACHE_VERSIONS)
        raise UsageError(
            f"the installed Triton is {version}; --format triton-autotune writes the autotune cache of Triton {known} "
            "only (its cache file names are computed as that version's check_disk_cache computes them)",
            hint=f"export with Triton {known}, the version the application runs",
        )
    if triton.knobs.runtime.interpret:
        raise UsageError(
            "TRITON_INTERPRET=1: Triton interprets kernels here, and its autotuner keeps no cache when it does",
            hint="unset TRITON_INTERPRET to export",
        )
    return version


def user_kernels(specs: Mapping[str, Any]) -> dict[str, Any]:
    """{name: the `Autotuned` object} of every registered kernel declared with `nbxcert.autotune` (its spec's
    `problem_of` is that object's method)."""
    from nbxcert.dropin import Autotuned

    out = {}
    for name, spec in specs.items():
        owner = getattr(spec.problem_of, "__self__", None)
        if isinstance(owner, Autotuned):
            out[name] = owner
    return out


def jit_function(owner):
    """The compiled-mode JIT function under an `nbxcert.autotune` kernel (Triton's autotuner hashes its `cache_key`);
    `UsageError` when it is an interpreted one."""
    from triton.runtime.jit import JITFunction

    fn = owner.fn
    while not isinstance(fn, JITFunction) and hasattr(fn, "fn"):
        fn = fn.fn
    if not isinstance(fn, JITFunction):
        raise UsageError(
            f"kernel {owner.spec.name} is decorated for Triton's interpreter ({type(fn).__name__}): its autotune cache "
            "key is a compiled kernel's",
            hint="unset TRITON_INTERPRET and NBXCERT_BACKEND=interpreter to export",
        )
    return fn


def triton_configs(owner) -> list:
    """The `triton.Config` list Triton's autotuner holds (and hashes) for an `nbxcert.autotune` kernel: the one it was
    given, else one made of its candidates (see the module docstring)."""
    given = getattr(owner, "configs", None)
    if given:
        return list(given)
    import triton

    return [
        triton.Config(dict(c.kwargs), num_warps=c.num_warps, num_stages=c.num_stages) for c in owner.spec.candidates
    ]


def candidate_of(tc):
    """The `Config` a certificate records for a `triton.Config`: its constexprs, warps and stages, and `maxnreg` as
    the config field `maxnreg` when it has one (`nbxcert.dropin`)."""
    from nbxcert.kernels.spec import Config

    extra = {"maxnreg": int(tc.maxnreg)} if getattr(tc, "maxnreg", None) is not None else {}
    return Config.make(num_warps=tc.num_warps, num_stages=tc.num_stages, **dict(tc.kwargs), **extra)


def tuning_key(owner, key, entry: Mapping[str, Any] | None = None) -> tuple:
    """The tuning key Triton's `Autotuner.run` forms for a launch of `key`: the `key=` arguments' values, then every
    tensor argument's `str(dtype)` in argument order. Declared without `dtype_args`, the key's dtypes are those; with
    `dtype_args`, the tensors and their dtypes are those of the certified launch (`launch_dtypes`, from `entry`):
    the key may name fewer tensors than the launch passes, and Triton's key holds them all."""
    if tuple(owner.spec.dtype_args) == ("*",):
        dtypes = list(key.dtypes)
    else:
        dtypes = launch_dtypes(owner, key, entry)
    return tuple(key.values[k] for k in owner.key) + tuple(DTYPE_PREFIX + d for d in dtypes)


def launch_dtypes(owner, key, entry: Mapping[str, Any] | None) -> list[str]:
    """Every tensor argument's dtype, in argument order, of the launch a certificate entry of `key` certified: its
    spec's `make_inputs` for the entry's smallest certified problem (shapes only, on the host), whose `dtype_args`
    tensors must have the key's dtypes. `UsageError` when that launch cannot be made again or disagrees with the key:
    no tuning key Triton forms is then known."""
    from nbxcert.dropin import _dtype_name
    from nbxcert.kernels.inputs import shape_only

    name = owner.spec.name
    problem = (entry or {}).get("certified_problems", {}).get("smallest")
    if problem is None:
        raise UsageError(f"the entry records no certified problem: the tensors of {name}'s launch are not known")
    try:
        with shape_only():
            inputs = owner.spec.make_inputs(dict(problem), tuple(key.dtypes), 0, "cpu")
    except Exception as e:  # noqa: BLE001 - the user's make_inputs: its failure skips the key, with its reason
        raise UsageError(
            f"{name}'s make_inputs failed for {problem} ({type(e).__name__}: {e}): the dtypes of the tensors its "
            "launch passes, which Triton's tuning key holds, are not known"
        ) from None
    tensors = {n: t for n, t in inputs.tensors.items() if n in owner.arg_names and hasattr(t, "dtype")}
    for n, d in zip(owner.spec.dtype_args, key.dtypes, strict=False):
        made = _dtype_name(tensors[n]) if n in tensors else None
        if made != d:
            raise UsageError(
                f"{name}'s make_inputs passes {n} as {made or 'no tensor'}, the key names {d}: the launch certified is "
                "not the key's"
            )
    return [_dtype_name(tensors[n]) for n in owner.arg_names if n in tensors]


def backend_hash(gpu_target) -> str:
    """`make_backend(target).hash()`, as the autotuner asks of the driver's current target."""
    from triton.compiler.compiler import make_backend

    try:
        return make_backend(gpu_target).hash()
    except Exception as e:  # noqa: BLE001 - a missing ptxas or backend: one line, naming the target
        raise BackendUnavailable(
            f"Triton cannot name its backend's hash for {gpu_target}: {type(e).__name__}: {e}"
        ) from None


def autotune_cache_key(fn, gpu_target, key: tuple, configs: Sequence[Any]) -> str:
    """The SHA-256 hex digest Triton's `Autotuner.check_disk_cache` (3.6, 3.9) names a tuning key's cache by."""
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.runtime.cache import triton_key

    env_vars = get_cache_invalidating_env_vars()
    parts = [
        triton_key(),
        backend_hash(gpu_target),
        fn.cache_key,
        str(sorted(env_vars.items())),
        str(key),
    ] + [str(c) for c in configs]
    return hashlib.sha256("-".join(parts).encode("utf-8")).hexdigest()


def cache_dir_name(digest: str) -> str:
    """The directory Triton's `get_cache_manager` keeps a digest's files in: its bytes in base32, unpadded."""
    return base64.b32encode(bytes.fromhex(digest)).decode("utf-8").rstrip("=")


def configs_timings(entry: Mapping[str, Any], configs: Sequence[Any]) -> tuple[list, int]:
    """(`configs_timings` as Triton writes it, how many faster finalists were left out): the certified winner first
    with `[median ms]`, then the fully timed configs that were slower, each as `triton.Config(...).__dict__`."""
    from nbxcert.kernels.spec import Config

    by_config: dict = {}
    for tc in configs:
        by_config.setdefault(candidate_of(tc), tc)
    winner = Config.from_dict(entry["winner"]["config"])
    best = entry["winner"]["timing"]["median_us"]
    rows = [[dict(by_config[winner].__dict__), [best / 1e3]]]
    left_out = 0
    for config, timing in sorted(timed_configs(entry).items(), key=lambda ct: (ct[1]["median_us"], ct[0].label())):
        if config == winner or config not in by_config:
            continue
        if timing["median_us"] <= best:
            left_out += 1
            continue
        rows.append([dict(by_config[config].__dict__), [timing["median_us"] / 1e3]])
    return rows, left_out


def export_triton(found: Sequence[Any], owners: Mapping[str, Any], profile, out: Path, report: ExportReport) -> None:
    """Write Triton's autotune cache files of `found` (entries of `nbxcert.autotune` kernels) and the manifest."""
    import triton
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.runtime.cache import triton_key

    from nbxcert.census import target_of
    from nbxcert.kernels.spec import Config

    gpu_target = target_of(profile).gpu_target()
    files: dict[str, Any] = {}
    for f in found:
        owner = owners[f.kernel]
        if owner.prune_configs_by:
            reason = "declared with prune_configs_by: the configs Triton hashes are pruned by each run's arguments"
            report.skipped.append(Skipped(f.key, reason))
            continue
        configs = triton_configs(owner)
        if len(configs) < 2:
            report.skipped.append(Skipped(f.key, "one config: Triton's autotuner runs it untuned and caches nothing"))
            continue
        if any(getattr(tc, "pre_hook", None) is not None for tc in configs):
            report.skipped.append(Skipped(f.key, "a config has a pre_hook: Triton's autotuner caches no result then"))
            continue
        winner = Config.from_dict(f.entry["winner"]["config"])
        if winner not in {candidate_of(tc) for tc in configs}:
            reason = (
                f"its certified winner {winner.label()} is none of the kernel's configs (certified for another list)"
            )
            report.skipped.append(Skipped(f.key, reason))
            continue
        fn = jit_function(owner)
        try:
            key = tuning_key(owner, parse_key(f.key), f.entry)
        except UsageError as e:
            report.skipped.append(Skipped(f.key, e.message))
            continue
        digest = autotune_cache_key(fn, gpu_target, key, configs)
        rel = f"{cache_dir_name(digest)}/{fn.__name__[:150]}.autotune.json"
        rows, left_out = configs_timings(f.entry, configs)
        doc = {"key": list(key), "configs_timings": rows}
        atomic_write(out / rel, json.dumps(doc), make_parents=True)  # serialised as Triton writes its own
        item = {
            "key": f.key,
            "kernel": f.kernel,
            "tuning_key": list(key),
            "cache_key": digest,
            "configs": [str(c) for c in configs],
            "winner": rows[0][0],
            "faster_finalists_left_out": left_out,
            "certificate": str(f.path),
        }
        files[rel] = item
        report.written.append(Written(rel, (f.key,), {str(key): item}, f"tuning key {key}"))
    if not files:
        return
    manifest = {
        "schema_version": MANIFEST_SCHEMA,
        "format": "triton-autotune",
        "profile": profile.key,
        "triton": triton.__version__,
        "triton_key_sha256": hashlib.sha256(triton_key().encode("utf-8")).hexdigest(),
        "target": {"backend": gpu_target.backend, "arch": gpu_target.arch, "warp_size": gpu_target.warp_size},
        "backend_hash": backend_hash(gpu_target),
        "env": dict(sorted(get_cache_invalidating_env_vars().items())),
        "files": files,
    }
    atomic_write(out / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n", make_parents=True)
