"""What the reliability tests share: the fixtures folder, the interpreter's environment, the figures they print and
the command line run under the interpreter (tests/engine/)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
ROOT = Path(__file__).resolve().parent.parent
INTERPRETER_ENV = {"NBXCERT_BACKEND": "interpreter", "TRITON_INTERPRET": "1"}
# a fast subset of the demo workload (`nbxcert keys --profile interpreter --workload demo --kernels ...`): 12 keys
DEMO_KERNELS = "rmsnorm,add_rmsnorm,embedding,silu_and_mul,softmax,rope"


def figures(name: str, **values) -> None:
    """Print a test's figures and append them to $NBXCERT_RELIABILITY_REPORT (JSON lines) when it is set."""
    line = json.dumps({"test": name, **values}, sort_keys=True)
    print(line)
    path = os.environ.get("NBXCERT_RELIABILITY_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def nbx(*args, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the real command line, under the interpreter, with tests/fixtures importable (`--spec faulty_kernels`)."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("NBXCERT_")}
    e.update(INTERPRETER_ENV, COLUMNS="250", PYTHONPATH=os.pathsep.join([str(FIXTURES), *sys.path]))
    e.update(env or {})
    cmd = [sys.executable, "-m", "nbxcert", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=timeout)


def demo_keys(kernels: str | None = DEMO_KERNELS) -> set[str]:
    from nbxcert.keyfile import gather_keys
    from nbxcert.profiles import get_profile

    keys = gather_keys(get_profile("cpu/interpreter"), workload="demo", kernels=kernels.split(",") if kernels else None)
    return {k.text() for k in keys}


def certify_process(out: Path, log: Path, *args: str) -> subprocess.Popen:
    """`nbxcert certify ARGS` into `out`, leading a new process group that its workers join (one signal reaches all)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NBXCERT_")}
    env.update(INTERPRETER_ENV)
    cmd = [sys.executable, "-m", "nbxcert", "certify", "--profile", "interpreter", "--out", str(out), "--json"]
    cmd += list(args)
    with open(log, "ab") as f:
        return subprocess.Popen(cmd, env=env, stdout=f, stderr=f, start_new_session=True)


def entries(out: Path) -> dict[str, Path]:
    """key -> the file that certifies it; every file must load and validate whole, and no key may be in two files."""
    from nbxcert import certificates

    found: dict[str, Path] = {}
    for path in certificates.iter_files(out):
        for key in certificates.load_file(path).entries:
            assert key not in found, f"{key} is certified in {found[key]} and in {path}"
            found[key] = path
    return found


def probe_text(certs, mutate=None, key=None) -> str:
    entry = certs.probe_entry(300)
    if mutate:
        mutate(entry)
    doc = {"schema_version": 1, "kernel": "fault_probe", "dtype": "float32", "profile": "cpu/interpreter"}
    doc["entries"] = {key or certs.probe_key(300): entry}
    return json.dumps(doc, indent=2, sort_keys=True)


def run_writers(code: str, root: Path, n: int = 4) -> None:
    """Run `code` in `n` processes at once (argv: `root`, the process's index; tests/fixtures importable); each must
    exit 0."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(FIXTURES), *sys.path]))
    procs = [subprocess.Popen([sys.executable, "-c", code, str(root), str(i)], env=env) for i in range(n)]
    assert [p.wait(timeout=300) for p in procs] == [0] * n
