"""The cross-compiling backend: kernels compile for a named GPU target on a machine that need not have that GPU (or
any GPU), and nothing is launched.

Triton compiles for any target it has a backend for (`cuda` sm_70..., `hip` gfx...) once its active driver names
that target. `activate(target)` fixes this process's nbxcert backend as this one (`backends.fix`: kernel modules are
imported as plain `JITFunction`s and launch code takes its GPU path, on CPU tensors) and makes `CrossDriver` Triton's
active driver (`triton.runtime.driver.set_active`, as `triton_cuda.install` does for a real GPU). Every
`kernel[grid](...)` then goes through the whole of Triton's dispatch, exactly as a launch on that GPU would (binder,
16-byte divisibility specialization, constexprs, in-memory and on-disk caches, the compile), and ends in the driver's
launcher, `CrossLauncher`, which runs nothing and, inside `recording()`, notes the launch (`Launch`: the JIT function,
the compiled kernel, the grid). A compiled kernel's own runner (`CompiledKernel[grid]`, which served launch plans
replay) ends there too. The census (`nbxcert census`) and `benchmarks/bench_host.py` run in this backend; so do the
kernel tests that compile for a GPU (`tests/crosstools.py`).

What the driver answers Triton:

    target, device, stream        the target (`GPUTarget(backend, arch, warp_size)`); device 0; stream 0
    utils.get_device_properties   no limit on shared memory or threads: compiled figures are the caller's to judge
                                  (the census holds them to the device file, and must see the ones over it)
    utils.load_binary             loads nothing (registers and spills are read from the binary by whoever needs them)
    launcher_cls                  `CrossLauncher`

and `backends.device_info()` answers with a stand-in device of the target's SM count (`Target.sm_count`), by which
persistent kernels size their grid (the grid is no part of what is compiled).

One adjustment, where Triton allows it:

- NVIDIA targets: configs that lower alike share the work. Each step after the TTGIR (LLVM IR, PTX, cubin) is kept in
  Triton's on-disk cache under the hash of its input and options, num_stages aside, so before sm_80 (where num_stages
  changes nothing) the five num_stages of a tile cost one LLVM and one ptxas run, not five. Installed through Triton's
  stages hook (`knobs.runtime.add_stages_inspection_hook`); a Triton without the hook, or one where another hook is
  set, lowers every config on its own (slower; the same binaries).
- HIP targets: nothing is changed in Triton. Triton decides for every tensor argument of a HIP kernel whether it lies
  within 2 GiB (`HIPBackend.is_within_2gb`); Triton 3.9 answers that without torch when torch is not importable (an
  nbxcert tensor has no `ptr_range`, so: no pointer-range specialization; where torch is installed, Triton 3.9 loads
  it into the compiling process there), but Triton 3.6 imports torch there
  unconditionally, and gives no hook to answer otherwise. Under such a Triton HIP targets are refused with one line
  (`hip_needs_torch_free_triton`), never patched.

The backend is the process's: activate it before any kernel module is imported (Triton decides at decoration time
whether a kernel is interpreted), as `select()` would be called.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from nbxcert.errors import BackendUnavailable
from nbxcert.kernels.backends import BackendChoice, fix, triton_language_mode

# Triton's own names for its backends (`triton.backends.backends`) per target backend.
TRITON_BACKEND = {"cuda": "nvidia", "hip": "amd"}
NO_LIMIT = 2**31 - 1  # what the driver states for the device limits it does not enforce


@dataclass(frozen=True)
class Target:
    """What Triton compiles for: `GPUTarget(backend, arch, warp_size)`, plus the stand-in device's SM count."""

    backend: str  # "cuda" or "hip"
    arch: int | str  # 90 (compute capability as 10*major+minor) or "gfx942"
    warp_size: int
    profile: str  # the profile key, e.g. "nvidia/hopper"
    sm_count: int  # the largest SKU's SMs / CUs: persistent kernels size their grid by it (the grid compiles nothing)

    def text(self) -> str:
        return f"{self.backend} sm_{self.arch}" if self.backend == "cuda" else f"{self.backend} {self.arch}"

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("backend", "arch", "warp_size", "profile", "sm_count")}

    def gpu_target(self):
        """Triton's `GPUTarget` of this target."""
        from triton.backends.compiler import GPUTarget

        return GPUTarget(self.backend, self.arch, self.warp_size)


# --- the nbxcert backend ----------------------------------------------------------------------------------------------
def choice(target: Target) -> BackendChoice:
    """The backend choice of a process cross-compiling for `target`: named after the target's backend (launch code
    takes its GPU path), tensors on the CPU, and a stand-in device that `backends.device_info()` answers with."""
    from nbxcert.kernels.backends import cuda

    stand_in = cuda.DeviceInfo(
        index=0,
        name=f"{target.profile} (cross-compiling stand-in, no device)",
        compute_capability=divmod(target.arch, 10) if isinstance(target.arch, int) else (0, 0),
        total_memory=0,
        pci_bus_id="",
        attributes={"multiprocessor_count": target.sm_count},
    )
    reason = f"cross-compiling for {target.text()} ({target.profile}) on the CPU: nothing launched"
    return BackendChoice(target.backend, reason, "cpu", stand_in=stand_in)


def choose(target: Target, keep_chosen: bool = False) -> BackendChoice:
    """Fix this process's nbxcert backend as this one for `target`, without Triton's driver: kernel modules import as
    plain JITFunctions and nothing compiles here (the census's own process, which plans and judges while its workers
    compile). With `keep_chosen`, a backend already in force stays. Returns the backend in force."""
    return fix(choice(target), keep_chosen=keep_chosen)


# --- the Triton driver ------------------------------------------------------------------------------------------------
_tls = threading.local()  # .record: the `recording()` this thread's launches are noted in


class CrossUtils:
    """What Triton asks of a driver's `utils` to load a compiled kernel, answered with no device."""

    def __init__(self, target: Target):
        self.target = target

    def get_device_properties(self, device: int) -> dict[str, int]:
        # Triton refuses to load a kernel over the device's shared memory; here the caller judges the figures
        return {
            "max_shared_mem": NO_LIMIT,
            "multiprocessor_count": self.target.sm_count,
            "warpSize": self.target.warp_size,
            "max_num_regs": NO_LIMIT,
            "sm_clock_rate": 0,
            "mem_clock_rate": 0,
            "mem_bus_width": 0,
        }

    def load_binary(self, name: str, kernel: bytes, shared: int, device: int) -> tuple:
        """(module, function, n_regs, n_spills, n_max_threads): no module is loaded, and no thread count refused."""
        return 0, 0, None, None, NO_LIMIT

    def unload_module(self, module: int) -> None:
        pass


class CrossLauncher:
    """The launcher Triton makes for each kernel compiled under the cross driver (`launcher_cls(src, metadata)`).
    Called with a launch's grid, stream, handles and arguments, it runs nothing; inside `recording()` it notes the
    launch."""

    def __init__(self, src: Any, metadata: Any):
        self.src = src
        self.metadata = metadata
        self.fn = getattr(src, "fn", None)  # the JITFunction (an ASTSource's)
        self._compiled = None

    def __call__(self, *args: Any) -> None:
        record = getattr(_tls, "record", None)
        if record is not None:
            record.note(self, tuple(args[:3]))

    def compiled(self):
        """The compiled kernel this launcher belongs to (its `asm` and `metadata`), found in its JIT function's
        kernel cache by its metadata; None where there is none (a kernel compiled by `triton.compile` itself)."""
        if self._compiled is None:
            for caches in list(getattr(self.fn, "device_caches", {}).values()):
                found = next((k for k in caches[0].values() if getattr(k, "metadata", None) is self.metadata), None)
                if found is not None:
                    self._compiled = found
                    break
        return self._compiled


class CrossDriver:
    """Triton's active driver while cross-compiling: it names the target and owns no device (see the module doc)."""

    def __init__(self, target: Target):
        self.target = target
        self.gpu_target = target.gpu_target()
        self.utils = CrossUtils(target)
        self.launcher_cls = CrossLauncher

    @staticmethod
    def is_active() -> bool:
        return True

    def get_current_target(self):
        return self.gpu_target

    def get_current_device(self) -> int:
        return 0

    def set_current_device(self, device: int) -> None:
        pass

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_device_capability(self, device: int | None = None) -> tuple[int, int]:
        return divmod(self.target.arch, 10) if isinstance(self.target.arch, int) else (0, 0)

    def map_python_to_cpp_type(self, ty: str) -> str:
        raise NotImplementedError("the cross-compiling driver builds no C launcher")

    def get_active_torch_device(self):
        """torch's device for the target, where the caller's own module has imported torch (a torch-form kernel file
        asks for it at import, as Triton's tutorials do); nbxcert never imports it."""
        torch = sys.modules.get("torch")
        if torch is None:
            raise NotImplementedError("the cross-compiling driver has no torch device (torch is not imported)")
        return torch.device("cuda", 0)

    def get_benchmarker(self):
        raise NotImplementedError("the cross-compiling driver runs nothing to time")


# --- launches ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Launch:
    """One launch the cross driver took, and ran nothing of."""

    launcher: CrossLauncher
    grid: tuple
    seconds: float  # since the recording's previous launch (or its start): mostly this kernel's compile or cache load

    @property
    def fn(self):
        """The JIT function launched."""
        return self.launcher.fn

    @property
    def name(self) -> str:
        fn = getattr(self.fn, "fn", None)
        return fn.__name__ if fn is not None else self.launcher.metadata.name

    @property
    def metadata(self):
        """The compiled kernel's metadata (`shared`, `num_warps`, `hash`, `name`, ...)."""
        return self.launcher.metadata

    @property
    def compiled(self):
        """The compiled kernel (`asm`: its ptx / cubin or amdgcn / hsaco, ...); None if it cannot be found."""
        return self.launcher.compiled()


class _Record:
    def __init__(self) -> None:
        self.launches: list[Launch] = []
        self.mark = time.perf_counter()

    def note(self, launcher: CrossLauncher, grid: tuple) -> None:
        now = time.perf_counter()
        self.launches.append(Launch(launcher, grid, now - self.mark))
        self.mark = now


@contextlib.contextmanager
def recording() -> Iterator[list[Launch]]:
    """The launches this thread makes inside the block, in order (the list fills as they are made)."""
    previous = getattr(_tls, "record", None)
    record = _tls.record = _Record()
    try:
        yield record.launches
    finally:
        _tls.record = previous


def failing_kernel(exc: BaseException) -> str | None:
    """The name of the kernel whose launch raised `exc` (a compile error, a refused argument): the JIT function of the
    innermost `JITFunction.run` its traceback passes through; None when it came from elsewhere."""
    from triton.runtime.jit import JITFunction

    name = None
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        fn = frame.f_locals.get("self") if frame.f_code.co_name == "run" else None
        if isinstance(fn, JITFunction):
            name = fn.fn.__name__
        tb = tb.tb_next
    return name


# --- activation -------------------------------------------------------------------------------------------------------
_lock = threading.Lock()
_driver: CrossDriver | None = None
_undo: list[Callable[[], None]] = []  # what `deactivate` does, last first


def activate(target: Target) -> CrossDriver:
    """Make this process compile for `target` with no GPU and launch nothing (see the module doc); return the driver.

    Call it before any kernel module is imported. A repeat call for the same target returns the same driver; another
    target is refused (`BackendUnavailable`), as is a process whose nbxcert backend is another already."""
    global _driver
    with _lock:
        if _driver is not None:
            if _driver.target != target:
                raise BackendUnavailable(
                    f"this process cross-compiles for {_driver.target.text()} already, not {target.text()}"
                )
            return _driver
        if triton_language_mode() == "interpreted":
            raise BackendUnavailable(
                "Triton was imported with TRITON_INTERPRET=1 in this process, so its own helpers are interpreted and "
                f"cannot be compiled for {target.text()}",
                hint="unset TRITON_INTERPRET and NBXCERT_BACKEND before the process starts",
            )
        os.environ.pop("TRITON_INTERPRET", None)  # before anything imports Triton: its helpers are then compiled
        refusal = hip_needs_torch_free_triton() if target.backend == "hip" else None
        if refusal:
            raise BackendUnavailable(refusal, hint="pip install 'triton>=3.9' to cross-compile for AMD GPUs")
        os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9 warns when unset; 1 is its (and 3.6's)
        choose(target)
        from triton.runtime import driver as triton_driver

        made = CrossDriver(target)
        triton_driver.set_active(made)
        _undo.append(lambda: triton_driver.set_active(None))  # none: Triton picks its default on next use, as before
        if target.backend != "hip":
            _share_identical_lowering()
        _driver = made
        return made


def deactivate() -> None:
    """Give Triton back what `activate` changed in it, last first: the stages hook (NVIDIA targets) and the active
    driver (none is then active: Triton picks its default on next use). The process's nbxcert backend stays
    this one (it is fixed once per process), and kernels compiled meanwhile stay compiled for the target."""
    global _driver
    with _lock:
        while _undo:
            _undo.pop()()
        _driver = None


def active() -> CrossDriver | None:
    """The driver `activate` installed, or None."""
    return _driver


# --- NVIDIA: configs that lower alike share the work ------------------------------------------------------------------
_MEMO = "nbxcert-census"  # the file names a kept step's output and metadata have in Triton's cache
_HOOK_KEY = "nbxcert-cross-lowering-memo-1"  # what the stages hook adds to a kernel's cache key (it changes no code)


def _share_identical_lowering() -> None:
    """Before sm_80 Triton 3.6 does not pipeline, so every num_stages of a tile lowers to one TTGIR, one LLVM IR, one
    PTX and one cubin (seen for every flash-attention candidate on sm_70), yet each config compiles all of them again
    under its own cache key: minutes of LLVM and ptxas per large tile. Each of those steps depends only on its input
    text (with its source locations), the target and the options it reads, never on num_stages (which acts through
    the TTGIR; Triton 3.6 and 3.9 read none of it after), so each step's output and the metadata it sets are kept in
    Triton's on-disk cache under the hash of those, and a repeat is answered from it (shared by processes, kept across
    runs). Installed as Triton's stages hook, which sees the stages of every compile."""
    from triton import knobs

    runtime = knobs.runtime
    if getattr(runtime, "add_stages_inspection_hook", "absent") is not None:
        return  # a Triton without the hook, or another hook in place: every config lowers on its own
    runtime.add_stages_inspection_hook = _stages_hook
    _undo.append(lambda: setattr(runtime, "add_stages_inspection_hook", None))


def _stages_hook(*args):
    """Triton's stages hook: called with no argument, it says what it adds to a kernel's cache keys; called with
    (backend, stages, options, language, capability) as a compile builds its pipeline, it wraps the stages."""
    if not args:
        return _HOOK_KEY, hashlib.sha256(_HOOK_KEY.encode()).hexdigest()[:16]
    if len(args) == 5 and isinstance(args[1], dict):  # another calling convention: the stages stay as they are
        backend, stages, options, _language, capability = args
        _memoize_stages(backend, stages, options, capability)
    return None


def _memoize_stages(backend, stages: dict, options, capability) -> None:
    """Wrap one NVIDIA compile's LLVM IR, PTX and cubin steps (`stages[ext](src, metadata)`) in the memo."""
    if "cubin" not in stages:
        return  # not NVIDIA's pipeline

    def context() -> tuple:
        return _lowering_context(backend, options, capability)

    for ext, stage in (("llir", "make_llir"), ("ptx", "make_ptx"), ("cubin", "make_cubin")):
        if ext in stages:
            stages[ext] = _memoized(stages[ext], stage, ext, context)


def _lowering_context(backend, opt, capability) -> tuple:
    """What a step after the TTGIR reads besides its input: Triton's version, the target, the options but
    num_stages, the compilation knobs it reads and the ptxas it runs."""
    from triton import __version__, knobs
    from triton.backends.nvidia.compiler import CUDABackend, get_ptxas

    options = {k: v for k, v in dataclasses.asdict(opt).items() if k != "num_stages"}
    c, n = knobs.compilation, knobs.nvidia
    tool = get_ptxas(backend.target.arch)
    return (
        __version__,
        backend.target.arch,
        capability,
        sorted(options.items(), key=lambda kv: kv[0]),
        # read where this Triton has them (3.9's CUDABackend has no `instrumentation`; seen in CI, 2026-11-29)
        tuple(
            getattr(c, k, None)
            for k in (
                "disable_line_info",
                "dump_ir_extract_di_local_variables",
                "instrumentation_mode",
                "enable_asan",
            )
        ),
        (n.disable_ptxas_opt, tool.path, tool.version, getattr(CUDABackend, "instrumentation", None) is None),
    )


def _memoized(step: Callable, stage: str, ext: str, context: Callable[[], tuple]) -> Callable:
    """`step(src, metadata)` answered from the cache when its input and `context()` repeat."""
    from triton.runtime.cache import get_cache_manager

    def run(src, metadata):
        text = src if isinstance(src, str) else str(src)  # an MLIR module prints with its source locations
        head = repr((stage, context())).encode()
        cache = get_cache_manager(hashlib.sha256(head + b"\0" + text.encode()).hexdigest())
        out, meta = cache.get_file(f"{_MEMO}.{ext}"), cache.get_file(f"{_MEMO}.json")
        if out is not None and meta is not None:
            with open(meta) as f:
                metadata.update(json.load(f))
            with open(out, "rb" if ext == "cubin" else "r") as f:
                return f.read()
        before = dict(metadata)
        result = step(src, metadata)
        changed = {k: v for k, v in metadata.items() if k not in before or before[k] != v}
        cache.put(result, f"{_MEMO}.{ext}", binary=ext == "cubin")
        cache.put(json.dumps(changed), f"{_MEMO}.json", binary=False)  # the json last: a hit needs both files
        return result

    return run


# --- HIP: refused under a Triton that imports torch for every tensor argument ----------------------------------------
def hip_needs_torch_free_triton() -> str | None:
    """Why the installed Triton cannot cross-compile HIP kernels without torch, or None.

    `HIPBackend.is_within_2gb`, which Triton calls for every tensor argument of a HIP kernel, imports torch
    unconditionally in Triton 3.6 (an ImportError where torch is absent, torch loaded where it is present); Triton 3.9
    first asks whether torch is importable (`HIPBackend._torch_available`) and answers without it when it is not."""
    import importlib.metadata

    from triton.backends.amd.compiler import HIPBackend

    if hasattr(HIPBackend, "_torch_available"):
        return None
    return (
        f"Triton {importlib.metadata.version('triton')}'s HIP backend imports torch for every tensor argument "
        "(HIPBackend.is_within_2gb), and nbxcert never loads torch: HIP targets cannot be cross-compiled with it"
    )
