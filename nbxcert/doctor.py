"""`nbxcert doctor`: the truth about this machine, with or without a GPU.

Reads the PCI bus (`/sys/bus/pci/devices`) for GPUs of every vendor, tries each vendor's runtime library, asks the
installed Triton which backends it has, and for a usable NVIDIA GPU reads its properties through libcuda and matches
it to a device file. Nothing here launches a kernel or imports torch (torch is only looked up, never imported).

It also reads every certificate directory serving would search (`NBXCERT_CERTIFIED_DIR`, then the shipped ones) and
counts, per profile, the certifications that apply to this machine and the ones it rejects, with the reason: another
profile or memory class, or a provenance serving would not take silently (another Triton major, driver major or
device profile: `nbxcert.serving.provenance_differences`).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nbxcert._version import __version__

PCI_ROOT = Path("/sys/bus/pci/devices")
VENDORS = {"0x10de": "NVIDIA", "0x1002": "AMD", "0x8086": "Intel"}
RUNTIME_LIBS = {"NVIDIA": "libcuda.so.1", "AMD": "libamdhip64.so", "Intel": "libze_loader.so.1"}
TRITON_BACKEND = {"NVIDIA": "nvidia", "AMD": "amd", "Intel": "intel"}
INSTALL_STEPS = {
    "NVIDIA": "install the NVIDIA driver for this GPU (https://docs.nvidia.com/datacenter/tesla/driver-installation-guide/)"
    " so that libcuda.so.1 loads, then run `nbxcert doctor` again",
    "AMD": "install ROCm (https://rocm.docs.amd.com/projects/install-on-linux/) so that libamdhip64.so loads;"
    " nbxcert serves AMD profiles once a hip backend exists",
    "Intel": "install the oneAPI Level Zero loader and intel-xpu-backend-for-triton; nbxcert has no Intel profiles yet",
}


@dataclass
class PciGpu:
    address: str
    vendor: str
    vendor_id: str
    device_id: str
    pci_class: str
    runtime_library: str
    runtime_loads: bool
    runtime_error: str
    triton_backend: bool


@dataclass
class CudaGpu:
    index: int
    name: str
    compute_capability: str
    total_memory_bytes: int
    pci_bus_id: str
    profile: str
    profile_match: str
    profile_notice: str
    memory_class: str
    certified_keys: int


@dataclass
class DoctorReport:
    backend: str
    backend_reason: str
    backend_usable: bool
    pci_gpus: list[PciGpu] = field(default_factory=list)
    cuda_gpus: list[CudaGpu] = field(default_factory=list)
    driver_version: str = ""
    cuda_version: str = ""
    versions: dict[str, str] = field(default_factory=dict)
    torch_importable: bool = False
    oracle_products: str = ""  # `kernels.products.describe`: numpy on the host, or cuBLAS on the GPU
    compile_pool: str = ""  # `crosspool.describe`: where certify's and the sweep's candidates compile
    problems: list[str] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)
    certificates: dict = field(default_factory=dict)  # `check_certificates`: which apply here, which are rejected
    serving: dict = field(default_factory=dict)  # `check_serving`: the NBXCERT_* settings a serving process reads

    def as_dict(self) -> dict:
        return asdict(self)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def scan_pci(root: Path = PCI_ROOT) -> list[tuple[str, str, str, str]]:
    """(address, vendor id, device id, class) of every display controller (PCI class 0x03xxxx) on the bus."""
    found = []
    if not root.is_dir():
        return found
    for dev in sorted(root.iterdir()):
        pci_class = _read(dev / "class")
        if pci_class.startswith("0x03"):
            found.append((dev.name, _read(dev / "vendor"), _read(dev / "device"), pci_class))
    return found


def _try_load(lib: str) -> tuple[bool, str]:
    try:
        ctypes.CDLL(lib)
        return True, ""
    except OSError as e:
        return False, str(e)


def _triton_backends() -> set[str]:
    try:
        from triton.backends import backends

        return set(backends)
    except ImportError:
        return set()


def _certified_key_count(profile_key: str) -> int:
    from importlib.resources import files

    base = files("nbxcert.shipped_certificates")
    count = 0
    for part in profile_key.split("/"):
        base = base / part
    if not base.is_dir():
        return 0
    import json

    for entry in base.iterdir():
        if entry.name.endswith(".json"):
            try:
                count += len(json.loads(entry.read_text()).get("entries", {}))
            except (ValueError, AttributeError):
                continue  # an invalid certificate is `validate`'s to report; doctor only counts the good ones
    return count


def _version(module: str) -> str:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:  # noqa: BLE001 - a missing distribution is reported as such, not raised
        return "not installed"


def run_doctor(pci_root: Path = PCI_ROOT) -> DoctorReport:
    from nbxcert.errors import NbxcertError
    from nbxcert.kernels.backends import cuda, peek, select

    try:
        choice = peek()
        report = DoctorReport(choice.name, choice.reason, True)
    except NbxcertError as e:
        report = DoctorReport("none", str(e), False)
        # the next step, which the exit code 1 alone did not give: the error's own hint sends the user to doctor
        report.advice.append(
            "set NBXCERT_BACKEND=interpreter to run on the CPU, or unset it (cuda where an NVIDIA GPU answers, "
            "else the interpreter)"
        )
    if report.backend_usable:
        # the backend set up as every other command sets it up, before anything here imports Triton (a Triton
        # imported first is compiled-mode, and the interpreter refuses it); its refusal (numpy too new for this
        # Triton's interpreter, ...) is doctor's problem line, and its hint the next step
        try:
            select()
        except NbxcertError as e:
            report.backend_usable = False
            report.problems.append(e.message)
            if e.hint:
                report.advice.append(e.hint)
    report.versions = {
        "nbxcert": __version__,
        "triton": _version("triton"),
        "numpy": _version("numpy"),
        "python": platform.python_version(),
    }
    report.torch_importable = importlib.util.find_spec("torch") is not None
    backends = _triton_backends()
    for address, vendor_id, device_id, pci_class in scan_pci(pci_root):
        vendor = VENDORS.get(vendor_id, f"unknown ({vendor_id})")
        lib = RUNTIME_LIBS.get(vendor, "")
        loads, err = _try_load(lib) if lib else (False, "no runtime library known for this vendor")
        report.pci_gpus.append(
            PciGpu(
                address,
                vendor,
                vendor_id,
                device_id,
                pci_class,
                lib,
                loads,
                err,
                TRITON_BACKEND.get(vendor, "") in backends,
            )
        )
    ok, why = cuda.available()
    if ok:
        _fill_cuda(report, cuda)
    elif any(g.vendor == "NVIDIA" for g in report.pci_gpus):
        report.problems.append(f"an NVIDIA GPU is on the PCI bus but CUDA is not usable: {why}")
    for vendor in sorted({g.vendor for g in report.pci_gpus if not g.runtime_loads}):
        if vendor in INSTALL_STEPS:
            report.advice.append(f"{vendor}: {INSTALL_STEPS[vendor]}")
    if os.environ.get("NBXCERT_BACKEND", "").strip() == "interpreter" and ok:
        report.advice.append("NBXCERT_BACKEND=interpreter is set: kernels run on the CPU although a GPU is usable")
    report.serving = check_serving(report)
    if report.backend_usable:
        report.certificates = check_certificates(report)
        report.oracle_products = _oracle_products(choice)
        report.compile_pool = _compile_pool(choice)
    report.advice = list(dict.fromkeys(report.advice))  # one line per next step, however many problems it mends
    return report


def _oracle_products(choice) -> str:
    from nbxcert.errors import NbxcertError
    from nbxcert.kernels import products

    try:
        return products.describe(choice.device, choice.name)
    except NbxcertError as e:  # NBXCERT_ORACLE_PRODUCTS=device with no libcublas, or a bad value: doctor says so
        return f"unusable: {e}"


def _compile_pool(choice) -> str:
    from nbxcert import crosspool
    from nbxcert.errors import NbxcertError

    try:
        return crosspool.describe(choice.name)
    except NbxcertError as e:  # a bad NBXCERT_COMPILE_POOL: doctor says so
        return f"unusable: {e}"


def check_serving(report: DoctorReport) -> dict:
    """The settings a serving process reads (`nbxcert.serving.lookup.state`), each as it would read it: a value it
    refuses (`NBXCERT_CERTIFIED_ONLY=yes`, `NBXCERT_UNCERTIFIED=bogus`: the application's first launch raises) and a
    certificate directory or cache it cannot use are doctor's problems, each with its next step."""
    from nbxcert.errors import UsageError
    from nbxcert.index import cache_dir
    from nbxcert.options import env_flag, writable_dir
    from nbxcert.serving import search_path, uncertified_mode

    out: dict = {}

    def read(field: str, variable: str, how) -> None:
        try:
            out[field] = how()
        except UsageError as e:
            out[field] = f"refused: {e.message}"
            report.problems.append(f"{e.message}: a serving process refuses its first launch")
            report.advice.append(e.hint if variable in e.hint else f"{variable}: {e.hint}")

    read("certified_only", "NBXCERT_CERTIFIED_ONLY", lambda: env_flag("NBXCERT_CERTIFIED_ONLY"))
    read("strict_provenance", "NBXCERT_STRICT_PROVENANCE", lambda: env_flag("NBXCERT_STRICT_PROVENANCE"))
    read("uncertified", "NBXCERT_UNCERTIFIED", uncertified_mode)
    out["search_path"] = [str(d) for d in search_path()]
    cache = cache_dir()
    out["cache_dir"] = str(cache)
    try:
        writable_dir(cache, "the index cache", write=False)
    except UsageError as e:  # a file, under a file, or not reachable: every serving process indexes in memory
        out["cache_writable"] = False
        report.problems.append(f"{e.message}: every serving process builds its certificate index in memory")
        report.advice.append("give NBXCERT_CACHE_DIR a directory you can write (unset: ~/.cache/nbxcert)")
    else:  # one that cannot be written is no fault where its indexes were built ahead (a read-only install)
        try:
            writable_dir(cache, "the index cache")
            out["cache_writable"] = True
        except UsageError:
            out["cache_writable"] = False
    return out


MAX_LISTED = 50  # rejected certifications and invalid files listed one by one (all are counted)


def check_certificates(report: DoctorReport, dirs: list[Path] | None = None) -> dict:
    """Every certification in the serving search path (or `dirs`): per profile, how many apply to this machine and
    how many it rejects, with the reasons counted; the rejected ones of this machine's profile and the invalid files
    listed. Reads JSON only; never raises on what the files hold."""
    from nbxcert.dirscan import scan_dir
    from nbxcert.serving import Machine, major_version, provenance_differences, search_path

    if report.backend == "cuda" and report.cuda_gpus:
        gpu = report.cuda_gpus[0]
        profile, memory_class, driver = gpu.profile, gpu.memory_class, major_version(report.driver_version)
    elif report.backend == "interpreter":
        profile, memory_class, driver = "cpu/interpreter", "cpu", "none"
    else:
        return {}
    machine = Machine(profile, major_version(report.versions.get("triton", "")), driver)
    out: dict = {
        "machine": {**vars(machine), "memory_class": memory_class},
        "strict": report.serving.get("strict_provenance") is True,
        "dirs": [],
        "profiles": {},
        "rejected": [],
        "invalid": [],
        "invalid_count": 0,
    }
    from nbxcert.certificates import class_entries, of_class
    from nbxcert.files import is_dir, unreachable

    for d in dirs if dirs is not None else search_path():
        why = unreachable(d)
        if why is not None:  # a directory under one that cannot be searched raised PermissionError: a traceback
            report.problems.append(
                f"certificate directory {d} cannot be reached ({why}); its certificates are not read"
            )
            continue
        if not is_dir(d):  # serving skips it; a user who put it on NBXCERT_CERTIFIED_DIR was not told
            what = "is not a directory" if d.exists() else "does not exist"
            report.problems.append(f"certificate directory {d} (NBXCERT_CERTIFIED_DIR) {what}; serving skips it")
            report.advice.append("fix NBXCERT_CERTIFIED_DIR: colon-separated certificate directories that exist")
            continue
        out["dirs"].append(str(d))
        scan = scan_dir(Path(d))
        out["invalid_count"] += len(scan.problems)
        out["invalid"] += [p.as_dict() for p in scan.problems][: MAX_LISTED - len(out["invalid"])]
        for found in scan.found.values():
            row = out["profiles"].setdefault(found.profile, {"apply": 0, "rejected": 0, "reasons": {}})
            own = of_class(found.entry, memory_class)  # a key may hold entries of several memory classes
            if found.profile != machine.profile:
                reasons = [f"for {found.profile}, not this machine's profile {machine.profile}"]
            elif own is None:
                held = ", ".join(class_entries(found.entry))
                reasons = [f"memory class {held}, this machine's is {memory_class}"]
            else:
                reasons = provenance_differences(own["provenance"], machine)
            if not reasons:
                row["apply"] += 1
                continue
            row["rejected"] += 1
            for r in reasons:
                row["reasons"][r] = row["reasons"].get(r, 0) + 1
            if found.profile == machine.profile and len(out["rejected"]) < MAX_LISTED:
                out["rejected"].append({"file": str(found.path), "key": found.key, "reasons": reasons})
    return out


def _fill_cuda(report: DoctorReport, cuda) -> None:
    from nbxcert.errors import ProfileNotFound
    from nbxcert.memory_class import memory_class
    from nbxcert.profiles import match_nvidia
    from nbxcert.serving import nvidia_driver_version

    major, minor = cuda.driver_version()
    report.cuda_version = f"{major}.{minor}"
    report.driver_version = nvidia_driver_version()
    for index in range(cuda.device_count()):
        info = cuda.device_info(index)
        cc = f"{info.compute_capability[0]}.{info.compute_capability[1]}"
        try:
            profile, how = match_nvidia(info.compute_capability)
            notice = ""
            if how == "family":
                notice = f"compute capability {cc} has no device file of its own; it runs on the family profile"
            gpu = CudaGpu(
                index,
                info.name,
                cc,
                info.total_memory,
                info.pci_bus_id,
                profile.key,
                how,
                notice,
                memory_class(profile, info.total_memory, info.attributes.get("multiprocessor_count")),
                _certified_key_count(profile.key),
            )
        except ProfileNotFound as e:
            gpu = CudaGpu(index, info.name, cc, info.total_memory, info.pci_bus_id, "none", "none", str(e), "", 0)
            report.problems.append(str(e))
        report.cuda_gpus.append(gpu)
