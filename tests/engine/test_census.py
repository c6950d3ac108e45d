"""`nbxcert census`: candidates cross-compiled for a GPU class on a CPU-only machine, figures held to the device file.

The CLI tests run the real command in a subprocess (its workers must not be in interpreter mode, which this test
process is) and assert the exit code, the lines that must appear and those that must not (never a traceback). The
deliberately wrong prune (`tests/fixtures/wrong_prune.py`, `--spec wrong_prune`) keeps a config that needs more shared
memory than Hopper has and drops one that fits: the census must report the first as a prune defect and fail, and the
second as an over-prune whose claim the compiler refutes. `test_census_ci_subset` is the census CI runs: one kernel of
each family, one profile per vendor the installed Triton can target. The parsers and the limits are tested in-process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from clitools import check

from nbxcert.census import _RES_USAGE, CHECKED_FACTS, Case, Limits, _amdgpu_registers, target_of
from nbxcert.errors import BackendUnavailable, UsageError
from nbxcert.kernels.spec import Config
from nbxcert.profiles import get_profile

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
WRONG = ("--spec", "wrong_prune", "--kernels", "wrong_prune_mm")


def nbx(*args, timeout: int = 600) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.update(NBXCERT_BACKEND="interpreter", COLUMNS="250", PYTHONPATH=os.pathsep.join([str(FIXTURES), *sys.path]))
    cmd = [sys.executable, "-m", "nbxcert", "census", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=timeout)


def _triton_has(name: str) -> bool:
    import triton.backends

    return name in triton.backends.backends


# --- targets and limits (in-process) ----------------------------------------------------------------------------------
def test_target_of_each_vendor():
    hopper = target_of(get_profile("hopper"))
    assert (hopper.backend, hopper.arch, hopper.warp_size, hopper.text()) == ("cuda", 90, 32, "cuda sm_90")
    assert target_of(get_profile("volta")).arch == 70
    if _triton_has("amd"):
        cdna3 = target_of(get_profile("cdna3"))
        assert (cdna3.backend, cdna3.arch, cdna3.warp_size) == ("hip", "gfx942", 64)
    with pytest.raises(UsageError, match="compiles nothing"):
        target_of(get_profile("interpreter"))


def test_a_triton_without_the_backend_is_refused_by_name(monkeypatch):
    import triton.backends

    monkeypatch.setattr(triton.backends, "backends", {k: v for k, v in triton.backends.backends.items() if k != "amd"})
    with pytest.raises(BackendUnavailable, match=r"has no 'hip' backend \('amd'; it has: nvidia\).*amd/cdna3"):
        target_of(get_profile("cdna3"))


def _kernel(shared=0, threads=128, regs=32, spills=0):
    return {"name": "k", "hash": "h", "shared": shared, "threads": threads, "n_regs": regs, "n_spills": spills}


def test_limits_name_the_fact_each_figure_exceeds():
    hopper = Limits.of(get_profile("hopper"))
    assert hopper.exceeded(_kernel(shared=232448, threads=1024, regs=64)) == []
    over = hopper.exceeded(_kernel(shared=232449, threads=2048, regs=40))
    assert over[0] == "shared 232449 B > max_shared_memory_per_block_optin 232448"
    assert over[1] == "2048 threads > max_threads_per_block 1024"
    # 40 registers x 2048 threads > 65536: the per-block budget binds below the per-thread one
    assert over[2].startswith("40 registers per thread > 32 (min of max_registers_per_thread 255")
    assert hopper.exceeded(_kernel(threads=128, regs=255)) == []
    # AMD files state no register limit: registers are reported, never held to a made-up number
    cdna3 = Limits.of(get_profile("cdna3"))
    assert cdna3.regs_per_thread is None and cdna3.exceeded(_kernel(regs=512)) == []
    assert cdna3.exceeded(_kernel(shared=65537)) == ["shared 65537 B > max_shared_memory_per_block_optin 65536"]


def test_an_over_prune_refutes_only_a_claim_the_compiler_answers():
    config = Config.make(num_warps=4, num_stages=2, BLOCK=64)

    def case(reason, spills=0):
        c = Case("k", {"n": 1}, ("float16",), config, False, reason, status="over_prune")
        c.kernels = [_kernel(spills=spills)]
        return c

    assert case("needs 245760 B of shared memory > max_shared_memory_per_block_optin=232448").refutes_claim
    assert not case("num_stages=3 > max_num_stages=1").refutes_claim  # a policy: the compiler cannot judge it
    registers = "tile: 300 registers per thread with num_warps=4 > 255 (min of max_registers_per_thread=255, ...)"
    assert case(registers).refutes_claim
    assert all(any(f in r for f in CHECKED_FACTS) for r in (registers, "x > max_threads_per_block=1024"))


def test_a_dropped_candidate_that_spills_confirms_a_register_claim():
    from nbxcert.census import _judge

    config = Config.make(num_warps=1, num_stages=1, BLOCK=8192)
    limits = Limits.of(get_profile("hopper"))
    registers = "a row tile of 8192 elements: 524 registers per thread with num_warps=1 > 255 (...)"
    for reason, spills, status in (
        (registers, 480, "refused_right"),  # ptxas capped the registers at 255 and spilled the rest: the claim holds
        (registers, 0, "over_prune"),
        ("row tile of 1 elements leaves a warp with no element of its own", 480, "over_prune"),
    ):
        case = Case("k", {"n": 1}, ("float16",), config, False, reason)
        _judge(case, {"status": "compiled", "kernels": [_kernel(threads=32, regs=255, spills=spills)]}, limits)
        assert case.status == status, (reason, spills)


def test_compiled_figures_are_read_from_the_binary():
    res_usage = (
        "\nResource usage:\n Common:\n  GLOBAL:0\n Function _mm_kernel:\n"
        "  REG:168 STACK:40 SHARED:0 LOCAL:8 CONSTANT[0]:552 TEXTURE:0 SURFACE:0 SAMPLER:0\n"
    )
    m = _RES_USAGE.search(res_usage)
    assert m.groups() == ("_mm_kernel", "168", "40", "8")
    asm = "amdhsa.kernels:\n  - .agpr_count: 0\n    .private_segment_fixed_size: 36\n    .vgpr_count: 128\n"
    assert _amdgpu_registers(asm) == (128, 9)
    assert _amdgpu_registers("") == (None, None)


def test_every_prune_answers_for_every_gpu_profile():
    """Bug found by the census: the rows and elementwise prunes asked AMD profiles for max_registers_per_thread, which
    AMD files do not state (DeviceFactMissing), so no rmsnorm, softmax, rope, ... key could be pruned, certified or
    census-compiled for CDNA or RDNA. Every spec's prune must answer for every GPU profile at its example problems."""
    from nbxcert.kernels.spec import load_all
    from nbxcert.profiles import all_profiles

    for profile in (p for p in all_profiles() if p.backend != "interpreter"):
        for spec in load_all().values():
            for problem in spec.example_problems:
                result = spec.prune(spec.candidates, problem, profile)
                assert len(result.kept) + len(result.pruned) == len(spec.candidates), (profile.key, spec.name)


def test_a_dropped_candidate_with_a_kept_ones_binary_is_no_over_prune():
    """Found by the Volta census: before sm_80 Triton does not pipeline, so every flash-attention and matmul config with
    num_stages > 1 (dropped by max_num_stages = 1) assembled to the very cubin of its num_stages = 1 sibling, which is
    kept; the census listed each as an over-prune (a lost option), thousands of them, though no option was lost."""
    from nbxcert.census import _same_code_as_kept

    def case(stages, kept, code, status, problem=1):
        config = Config.make(num_warps=4, num_stages=stages, B=64)
        c = Case("k", {"n": problem}, ("float16",), config, kept, "", key="k[n=2;float16]@v1")  # one key, two ends
        c.status, c.kernels = status, [_kernel() | {"code": code}]
        return c

    kept = case(1, True, "aaaa", "ok")
    twin = case(3, False, "aaaa", "over_prune")  # same binary as the kept one: nothing lost
    other = case(4, False, "bbbb", "over_prune")  # another binary: a lost option
    elsewhere = case(3, False, "aaaa", "over_prune", problem=2)  # the same binary, but no kept one at its problem
    unknown = case(5, False, None, "over_prune")
    _same_code_as_kept([kept, twin, other, elsewhere, unknown])
    statuses = [c.status for c in (twin, other, elsewhere, unknown)]
    assert statuses == ["same_code", "over_prune", "over_prune", "over_prune"]


def test_identical_lowering_is_done_once(monkeypatch, tmp_path):
    """Found by the Volta census: before sm_80 every num_stages of a tile lowers to one LLVM IR, PTX and cubin, yet each
    config ran LLVM and ptxas again (minutes per large flash-attention tile on sm_70; the census would take hours).
    A step whose input, target and options (but num_stages) repeat is answered from the cache, metadata included."""
    from dataclasses import dataclass, replace
    from types import SimpleNamespace

    from nbxcert.kernels.backends.cross import _stages_hook

    @dataclass(frozen=True)
    class Options:
        num_stages: int = 1
        enable_fp_fusion: bool = True
        ptx_options: str | None = None

    done = []

    def make_ptx(self, src, metadata, opt, capability):
        done.append(src)
        metadata["name"] = f"kernel_of_{src}"
        return f"ptx of {src} for sm_{capability}"

    def make_cubin(self, src, metadata, opt, capability):
        done.append(src)
        return f"cubin of {src}".encode()

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    backend = SimpleNamespace(target=SimpleNamespace(arch=70))

    def lowered(stage, src, metadata, opt, capability):
        """One step of one compile: its stages as the NVIDIA backend builds them, passed through the cross backend's
        stages hook as Triton passes them."""
        stages = {
            "ptx": lambda s, m: make_ptx(backend, s, m, opt, capability),
            "cubin": lambda s, m: make_cubin(backend, s, m, opt, capability),
        }
        _stages_hook(backend, stages, opt, None, capability)
        return stages[stage](src, metadata)

    first, again = {"num_stages": 1}, {"num_stages": 3}
    assert lowered("ptx", "llir A", first, Options(num_stages=1), 70) == "ptx of llir A for sm_70"
    assert lowered("ptx", "llir A", again, Options(num_stages=3), 70) == "ptx of llir A for sm_70"
    assert again == {"num_stages": 3, "name": "kernel_of_llir A"} and done == ["llir A"]  # metadata set on a hit too
    assert lowered("cubin", "ptx A", {}, Options(), 70) == b"cubin of ptx A"
    assert lowered("cubin", "ptx A", {}, Options(num_stages=5), 70) == b"cubin of ptx A"
    assert done == ["llir A", "ptx A"]
    lowered("cubin", "ptx B", {}, Options(), 70)  # another input
    lowered("cubin", "ptx A", {}, replace(Options(), enable_fp_fusion=False), 70)  # --fmad=false
    lowered("cubin", "ptx A", {}, Options(), 75)  # another target
    assert done == ["llir A", "ptx A", "ptx B", "ptx A", "ptx A"]


# --- the cross-compiling backend itself -------------------------------------------------------------------------------
def test_a_process_keeps_the_backend_it_chose():
    """The cross backend is fixed through `backends.fix`, which refuses to change a backend already in force (kernel
    modules were decorated for it) unless asked to keep it."""
    from nbxcert.kernels.backends import cross, select

    hopper = cross.Target("cuda", 90, 32, "nvidia/hopper", 132)
    in_force = select()
    with pytest.raises(BackendUnavailable, match="cannot become cuda"):
        cross.choose(hopper)
    assert cross.choose(hopper, keep_chosen=True) is in_force


@pytest.mark.parametrize("backend", ["cuda", "hip"])
def test_the_cross_backend_gives_triton_back_what_it_changed(backend):
    """`activate` sets Triton's driver, and the stages hook (NVIDIA); `deactivate` puts each back. No function of
    Triton's is replaced: HIP's pointer-range check stays Triton's own throughout. In a subprocess: the backend is the
    process's."""
    if backend == "hip" and not _triton_has("amd"):
        pytest.skip("the installed Triton has no AMD backend")
    target = {"cuda": ("cuda", 90, 32, "nvidia/hopper", 132), "hip": ("hip", "gfx942", 64, "amd/cdna3", 304)}[backend]
    code = f"""
from triton import knobs
from triton.runtime import driver
from nbxcert.kernels.backends import cross, device_info, select
hip = None
if {backend!r} == "hip":
    from triton.backends.amd.compiler import HIPBackend
    hip = HIPBackend.__dict__["is_within_2gb"]
target = cross.Target(*{target!r})
made = cross.activate(target)
assert driver.active is made and cross.activate(target) is made and select().name == {backend!r}
assert device_info().attributes["multiprocessor_count"] == target.sm_count
if hip is None:
    assert knobs.runtime.add_stages_inspection_hook is not None
else:
    assert HIPBackend.__dict__["is_within_2gb"] is hip
cross.deactivate()
assert knobs.runtime.add_stages_inspection_hook is None and cross.active() is None
assert hip is None or HIPBackend.__dict__["is_within_2gb"] is hip
try:
    assert driver.active is not made
except RuntimeError:  # no GPU driver here to become Triton's default
    pass
print("given back")
"""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "NBXCERT_BACKEND")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "given back", r.stdout + r.stderr


# --- the wrong prune is caught (CLI, subprocess) ----------------------------------------------------------------------
def test_wrong_prune_is_a_prune_defect_and_fails():
    text = check(
        nbx("--profile", "hopper", *WRONG, "--jobs", "1"),
        1,
        must=[
            "census nvidia/hopper (cuda sm_90",
            "prune defects: 1 (kept, over a device limit)",
            "BLOCK_K=128,BLOCK_M=128,BLOCK_N=128,warps=8,stages=4",
            "_wrong_prune_mm_kernel: shared 262144 B > max_shared_memory_per_block_optin 232448",
            "over-prunes: 1 (dropped, yet compiled within the limits)",
            "refuted: needs 245760 B of shared memory > max_shared_memory_per_block_optin=232448",
            "prune defects 1, compile failures 0, over-prunes 1 (1 refuting a resource estimate)",
        ],
        must_not=["nbxcert: ", "compile failures: "],
    )
    assert (
        "BLOCK_K=32,BLOCK_M=64,BLOCK_N=64" not in text.split("prune defects: 1")[1].split("over-prunes: 1")[0]
    )  # the small one fits

    r = nbx("--profile", "hopper", *WRONG, "--jobs", "1", "--json")
    check(r, 1)
    doc = json.loads(r.stdout)  # progress lines go to stderr when it is not a terminal
    assert doc["schema_version"] == 1 and doc["ok"] is False and doc["target"]["arch"] == 90
    assert doc["totals"]["defects"] == 1 and doc["totals"]["failures"] == 0 and doc["totals"]["over_prunes"] == 1
    (defect,) = doc["defects"]
    assert defect["config"]["kwargs"] == {"BLOCK_K": 128, "BLOCK_M": 128, "BLOCK_N": 128} and defect["kept"]
    assert defect["kernels"][0]["shared"] > 232448 and defect["kernels"][0]["n_regs"] > 0
    (over,) = doc["over_prunes"]
    assert over["config"]["kwargs"]["BLOCK_K"] == 16 and over["refutes_claim"] and over["kernels"][0]["shared"] < 65536


@pytest.mark.skipif(not _triton_has("amd"), reason="the installed Triton has no AMD backend")
def test_over_prunes_fail_only_with_strict_and_amd_compiles():
    """On CDNA3 (64 KiB of LDS) the prune drops both big configs: the huge one rightly (the compiler confirms it),
    the thin one wrongly (an over-prune, failing only with --strict)."""
    r = nbx("--profile", "cdna3", *WRONG, "--jobs", "1", "--json")
    check(r, 0)
    doc = json.loads(r.stdout)  # not stdout and stderr together: a slow run's progress lines go to stderr
    assert doc["target"] == {
        "backend": "hip",
        "arch": "gfx942",
        "warp_size": 64,
        "profile": "amd/cdna3",
        "sm_count": doc["target"]["sm_count"],
    }
    assert doc["totals"]["kept"] == 1 and doc["totals"]["compiled"] == 1 and doc["totals"]["defects"] == 0
    assert [o["config"]["kwargs"]["BLOCK_K"] for o in doc["over_prunes"]] == [16]
    check(nbx("--profile", "cdna3", *WRONG, "--jobs", "1", "--strict"), 1, must=["over-prunes: 1 (dropped"])


def test_usage_errors_are_one_line():
    r = nbx("--profile", "interpreter", "--kernels", "rmsnorm")
    check(r, 1, must=["nbxcert: usage: profile cpu/interpreter runs on the interpreter backend"])
    r = nbx("--profile", "hopper", "--kernels", "no_such_kernel")
    check(r, 1, must=["nbxcert: unknown kernel: no kernel named 'no_such_kernel'"])


# --- the census CI runs -----------------------------------------------------------------------------------------------
CI_KERNELS = ("gemv", "rmsnorm", "silu_and_mul", "decode_attention")  # one of each family: matmul, rows, elementwise,
# attention; their keys are their first example problem with their first dtypes (exact key fields: one problem each)


def _ci_profiles() -> list[str]:
    return ["hopper"] + (["cdna3"] if _triton_has("amd") else [])


@pytest.mark.slow
@pytest.mark.parametrize("profile_name", _ci_profiles())
def test_census_ci_subset(profile_name, tmp_path):
    """Every candidate of one kernel per family compiles for the profile's target, and none that the prune keeps
    exceeds a limit of the device file (about a minute per profile on two cores; a rerun reads Triton's cache)."""
    from nbxcert.kernels.spec import get_spec
    from nbxcert.keys import make_key

    profile = get_profile(profile_name)
    keys = tmp_path / "keys.jsonl"
    lines = []
    for name in CI_KERNELS:
        spec = get_spec(name)
        lines.append(json.dumps({"key": make_key(spec, spec.example_problems[0], spec.dtypes[0], profile).text()}))
    keys.write_text("\n".join(lines) + "\n")
    r = nbx("--profile", profile_name, "--keys", keys, "--jobs", "2", "--json", timeout=900)
    check(r, 0)
    doc = json.loads(r.stdout)  # progress lines go to stderr when it is not a terminal
    rows = {k["kernel"]: k for k in doc["kernels"]}
    assert sorted(rows) == sorted(CI_KERNELS)
    for row in rows.values():
        assert row["kept"] > 0 and row["compiled"] == row["kept"], row
        assert row["defects"] == 0 and row["failures"] == 0, (doc["defects"], doc["failures"])
