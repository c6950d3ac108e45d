"""Host cost of a device tensor made and dropped, the per-call extra of a served call that allocates its output:
`empty((rows, cols), float16, cuda:0)` then its release, after warm-up (so nbxcert's stream-ordered pool holds the
block: the allocation and the free are queued on the stream, nothing waits and no memory is reserved anew), the
median of --repeats runs of --calls each. `--compare-driver` also times the same through plain cuMemAlloc/cuMemFree
(what a pool is weighed against), in the same process. Also reported: the memory alone (`pool_alloc`) with a
freed block kept for the stream's next allocation of its size (`memory_kept_us`, the default) and through the
driver's pool alone (`memory_pool_us`, `memory.KEPT_PER_SIZE` 0).

    python3 benchmarks/bench_alloc.py [--fake] [--calls 20000] [--repeats 5] [--out alloc.json]

--fake runs over the fake libcuda the tests build (`tests/kernels/backends/test_cuda.py`, a C compiler needed):
the Python and ctypes part of the cost on a machine with no GPU. Without it, the real driver of the machine.
"""

from __future__ import annotations

import argparse
import atexit
import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _use_fake_driver() -> str:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise SystemExit("--fake: no C compiler (cc or gcc) to build the fake libcuda")
    spec = importlib.util.spec_from_file_location(
        "_fake_source", ROOT / "tests" / "kernels" / "backends" / "test_cuda.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    build = Path(tempfile.mkdtemp(prefix="nbxcert-fake-cuda-"))
    atexit.register(shutil.rmtree, build, True)  # the library stays loaded until the process ends
    (build / "fake_libcuda.c").write_text(module.FAKE_LIBCUDA_C)
    library = build / "libcuda.so.1"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(library), str(build / "fake_libcuda.c")], check=True)
    from nbxcert.kernels.backends import cuda

    cuda.LIBCUDA_NAME = str(library)
    return "fake libcuda (tests/kernels/backends/test_cuda.py)"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fake", action="store_true", help="over the tests' fake libcuda (no GPU needed)")
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--cols", type=int, default=2048)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--compare-driver", action="store_true", help="also time cuMemAlloc + cuMemFree per tensor")
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    driver = _use_fake_driver() if args.fake else "libcuda"
    from nbxcert.kernels.backends import cuda, memory
    from nbxcert.kernels.tensor import empty

    ok, reason = cuda.device_present(0)
    if not ok:
        raise SystemExit(f"bench_alloc: no CUDA device 0 ({reason}); --fake measures over the tests' fake libcuda")
    shape = (args.rows, args.cols)
    nbytes = args.rows * args.cols * 2

    def per_call(fn) -> list[float]:
        for _ in range(200):
            fn()
        runs = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            for _ in range(args.calls):
                fn()
            runs.append((time.perf_counter() - t0) / args.calls * 1e6)
        return runs

    tensor = per_call(lambda: empty(shape, "float16", "cuda:0"))  # a tensor as a caller makes one
    kept = per_call(lambda: memory.pool_alloc(nbytes, 0))  # the memory alone: the block kept for the stream reused
    kept_per_size, memory.KEPT_PER_SIZE = memory.KEPT_PER_SIZE, 0
    memory.release_kept()
    try:
        pool = per_call(lambda: memory.pool_alloc(nbytes, 0))  # the driver's pool alone: its allocation and free
    finally:
        memory.KEPT_PER_SIZE = kept_per_size
    result = {
        "driver": driver,
        "shape": list(shape),
        "calls": args.calls,
        "alloc_us": statistics.median(tensor),
        "runs_us": tensor,
        "memory_kept_us": statistics.median(kept),
        "memory_pool_us": statistics.median(pool),
        "memory_stats": memory.memory_stats(0),
    }
    if args.compare_driver:  # plain cuMemAlloc and cuMemFree (which waits for the device)
        plain = per_call(lambda: cuda.mem_alloc(nbytes, 0).free())
        result["driver_alloc_free_us"] = statistics.median(plain)
        result["driver_runs_us"] = plain
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
