"""What the kernel tests that compile for a GPU share: a job run in a subprocess in the cross-compiling backend
(`nbxcert.kernels.backends.cross`, the census's), where kernels compile for a GPU target and nothing is launched.

A subprocess, because kernels must be plain JITFunctions there, and this test process runs them interpreted (Triton
decides when a kernel is decorated). `cross_compile(arch, job, payload)` starts `python crosstools.py`, which
activates the cross backend for the target before any kernel module is imported, then runs `job(payload)` (a function
of a test module, or `launch_specs` below) and prints each result it yields as one JSON line when it is made, so a job
that dies still returns what it did.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

RESULT = "crosstools result: "  # the prefix of a result line (anything else printed is the job's own output)


def target(arch: int, sm_count: int = 132):
    """An NVIDIA target of compute capability `arch` (90 is sm_90), with `sm_count` SMs for a persistent kernel's
    grid (which compiles nothing)."""
    from nbxcert.kernels.backends.cross import Target

    return Target("cuda", arch, 32, f"sm_{arch} (tests)", sm_count)


def cross_compile(arch: int, job, payload, timeout: int) -> list:
    """The results `job(payload)` yields, run in a subprocess cross-compiling for sm_`arch`; asserts it exited 0."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "NBXCERT_BACKEND")}
    request = {"target": target(arch).as_dict(), "file": inspect.getfile(job), "job": job.__name__, "payload": payload}
    proc = subprocess.run(
        [sys.executable, __file__], input=json.dumps(request), capture_output=True, text=True, timeout=timeout, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line[len(RESULT) :]) for line in proc.stdout.splitlines() if line.startswith(RESULT)]


def launch_specs(items: list[dict]):
    """(In the subprocess.) Each item ({"spec", "config", "problem", "dtypes"}) launched as its spec launches it, on
    inputs of the spec's own `make_inputs`: the item with `ok` and, per kernel launched, its name, its shared memory
    and whether its PTX uses wgmma and the TMA bulk tensor copy; or `ok` false and the error."""
    from nbxcert.kernels.backends import cross
    from nbxcert.kernels.spec import Config, get_spec

    for item in items:
        try:
            spec = get_spec(item["spec"])
            inputs = spec.make_inputs(item["problem"], tuple(item["dtypes"]), 0, "cpu")
            with cross.recording() as launched:
                spec.launch(Config.from_dict(item["config"]), inputs)
            kernels = []
            for launch in launched:
                ptx = launch.compiled.asm["ptx"]
                kernels.append(
                    {
                        "name": launch.name,
                        "shared": launch.metadata.shared,
                        "wgmma": "wgmma" in ptx,
                        "tma": "cp.async.bulk.tensor" in ptx,
                    }
                )
            yield dict(item, ok=True, kernels=kernels)
        except Exception as e:  # noqa: BLE001 - reported with its item, the next one goes on
            yield dict(item, ok=False, error=f"{type(e).__name__}: {e}"[:2000])


def _main() -> None:
    request = json.loads(sys.stdin.read())
    from nbxcert.kernels.backends import cross

    cross.activate(cross.Target(**request["target"]))  # before the job's module imports any kernel module
    if Path(request["file"]).resolve() == Path(__file__).resolve():
        job = globals()[request["job"]]
    else:
        found = importlib.util.spec_from_file_location(f"crosstools_job_{Path(request['file']).stem}", request["file"])
        module = importlib.util.module_from_spec(found)
        found.loader.exec_module(module)
        job = getattr(module, request["job"])
    for result in job(request["payload"]):
        print(RESULT + json.dumps(result), flush=True)


if __name__ == "__main__":
    _main()
