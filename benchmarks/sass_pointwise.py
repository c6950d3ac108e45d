"""Instructions per element of each pointwise op compiled for an NVIDIA GPU, on a machine with no GPU: a diagnosis of
why an op reading and writing 16-bit values runs below the memory's speed (the work per element), never a speed.

Each op's kernel is cross-compiled (`nbxcert.kernels.backends.cross`) at its first example problem's layouts with
`--numel` elements (default 2^20: a multiple of 16, as a large tensor's count usually is, so Triton can prove whole
vectors in bounds and load 16 bytes at once; the example's own 37 elements load one at a time) and the untuned config
(BLOCK 1024, 4 warps: 8 elements a thread) for the target of `--arch` (default 90), and its SASS read by Triton's own
`nvdisasm`; the count leaves out NOPs. MUFU (the special-function unit: ex2, lg2, rsqrt, rcp) is
counted beside it: it issues at a quarter of the FMA pipe's rate, on a pipe of its own.

`--tile` counts the tiled kernel of a transposed operand (`DEFAULT_TILE`: 16 elements a thread) instead.
`--layout x=transposed,y=broadcast,...` lays the operands and the output out as a key's layout classes do (the
example's own otherwise; `kernels.pointwise.layout_of`): the index arithmetic of a view is counted too. The example's
2-d shape has rows of at most 64 (`shape_for`): `--numel` picks the row length (2^20: 64, a multiple of 16; 1000550:
50).

    python3 benchmarks/sass_pointwise.py [--ops log,exp,...] [--dtypes float16,bfloat16] [--numel N] [--arch 90]
        [--layout x=L,y=L,z=L,out=L] [--tile] [--out F.json] [--listing DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

DEFAULT_OPS = (
    "abs,exp,log,log2,log1p,expm1,rsqrt,reciprocal,round,sin,cos,tan,tanh,erf,sigmoid,silu,mish,elu,celu,selu,"
    "softplus,gelu,gelu_tanh,log_sigmoid,glu,pow,hypot,atan2"
)


def _instructions(cubin: bytes, nvdisasm: Path) -> list[str]:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
        path = f.name
    try:
        text = subprocess.run([str(nvdisasm), "-c", path], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(path)
    lines = [ln.split("*/", 1)[1].strip() for ln in text.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", ln)]
    return [ln for ln in lines if ln and not ln.startswith("NOP")]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default=DEFAULT_OPS, help="comma-separated op names (pw_<name> specs)")
    parser.add_argument("--dtypes", default="float16,bfloat16", help="comma-separated common dtypes")
    parser.add_argument("--arch", type=int, default=90, help="the sm_ architecture to compile for (default 90)")
    parser.add_argument("--numel", type=int, default=1 << 20, help="elements of each tensor (default 2^20)")
    parser.add_argument("--layout", default="", help="layout classes of x, y, z, out (e.g. y=broadcast,out=strided)")
    parser.add_argument(
        "--tile", action="store_true", help="the tiled kernel's untuned config (64 x 64, 8 warps: x=transposed only)"
    )
    parser.add_argument("--out", help="write the counts as JSON to this path")
    parser.add_argument("--listing", help="write each op's SASS to this folder (<op>.<dtype>.sass)")
    args = parser.parse_args(argv)
    layout = {}
    for item in filter(None, args.layout.split(",")):
        slot, _, cls = item.partition("=")
        if slot not in ("x", "y", "z", "out") or not cls:
            parser.error(f"--layout {item!r}: give SLOT=CLASS, SLOT one of x, y, z, out")
        layout[slot] = cls
    os.environ.setdefault("NBXCERT_BACKEND", "interpreter")  # no GPU here: nothing must try libcuda
    from nbxcert.kernels.backends import cross

    cross.activate(cross.Target("cuda", args.arch, 32, f"sm_{args.arch}", 132))
    import triton

    from nbxcert.kernels import pointwise
    from nbxcert.kernels.spec import get_spec

    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    if not nvdisasm.exists():
        print(f"bench: this Triton has no nvdisasm at {nvdisasm}", file=sys.stderr)
        return 2
    config = pointwise.DEFAULT_TILE if args.tile else pointwise.DEFAULT
    per_program = config["TILE_A"] * config["TILE_B"] if args.tile else config["BLOCK"]
    elements = per_program // (32 * config.num_warps)
    rows = []
    for name in args.ops.split(","):
        spec = get_spec("pw_" + name)
        for dtype in args.dtypes.split(","):
            dtypes = next((d for d in spec.dtypes if d[0] == dtype), None) or next(
                (d for d in spec.dtypes if d[-1] == dtype), None
            )
            if dtypes is None:
                continue
            problem = dict(spec.example_problems[0], numel=args.numel)
            missing = [slot for slot in layout if problem.get(slot, "none") == "none" and slot != "out"]
            if missing:
                print(f"bench: {name} has no operand {', '.join(missing)}: skipped", file=sys.stderr)
                continue
            inputs = spec.make_inputs(dict(problem, **layout), dtypes, 0, "cpu")
            with cross.recording() as launched:
                spec.launch(config, inputs)
            code = _instructions(launched[0].compiled.asm["cubin"], nvdisasm)
            mufu = sum(ins.startswith("MUFU") or " MUFU" in ins for ins in code)
            if args.listing:
                Path(args.listing).mkdir(parents=True, exist_ok=True)
                (Path(args.listing) / f"{name}.{dtype}.sass").write_text("\n".join(code) + "\n")
            rows.append(
                {
                    "op": name,
                    "dtypes": list(dtypes),
                    "instructions": len(code),
                    "mufu": mufu,
                    "per_element": len(code) / elements,
                }
            )
            print(
                f"{name:12s} {dtype:9s} {len(code):5d} instructions ({mufu:2d} MUFU), {len(code) / elements:5.1f} "
                "an element",
                flush=True,
            )
    if args.out:
        meta = {
            "arch": args.arch,
            "triton": triton.__version__,
            "config": config.label(),
            "numel": args.numel,
            "layout": layout,
        }
        Path(args.out).write_text(json.dumps({**meta, "elements_a_thread": elements, "ops": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
