"""What `nbxcert certify` spends between two keys on its certificate files, on the host, no GPU needed: for each key
of a workload, the lookups of the key and of the four after it (`done before?`, as certify's loop and its compile
queue ask) and the write of the key's entry, on a copy of the shipped certificates of a profile. Two ways: the
module's functions, which read and validate a whole file each time (`certificates.existing_entry`, `add_entry`),
and `certificates.Directory`, which certify keeps (each file read once, again only when another process wrote it,
one entry serialised a write). The GPU waits meanwhile: certify sends the next key's work after both.

    python3 benchmarks/bench_certificate_io.py [--workload llama-3-8b] [--profile hopper] [--keys 120] [--out F.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AHEAD = 4  # the keys after the current one certify's compile queue looks up (`ahead.AHEAD_KEYS`)


def _run(root: Path, keys, specs, profile, lookup, add) -> dict[str, float]:
    lookups = adds = 0.0
    written = 0
    for i, key in enumerate(keys):
        t = time.perf_counter()
        for k in keys[i : i + 1 + AHEAD]:
            lookup(k.kernel, specs[k.kernel].output_dtypes(k.dtypes)[0], k.text())
        lookups += time.perf_counter() - t
        dtype = specs[key.kernel].output_dtypes(key.dtypes)[0]
        old = lookup(key.kernel, dtype, key.text())
        if old is None:
            continue
        t = time.perf_counter()
        add(key.kernel, dtype, key.text(), old)  # the entry written again, as a re-certified key's would be
        adds += time.perf_counter() - t
        written += 1
    n = max(len(keys), 1)
    return {"lookups_ms_a_key": 1e3 * lookups / n, "write_ms_a_key": 1e3 * adds / max(written, 1), "written": written}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="llama-3-8b")
    parser.add_argument("--profile", default="hopper")
    parser.add_argument("--keys", type=int, default=120, help="the workload's first N keys (default 120)")
    parser.add_argument("--out", help="write the figures as JSON to this path")
    args = parser.parse_args(argv)
    os.environ.setdefault("NBXCERT_BACKEND", "interpreter")
    from nbxcert import certificates
    from nbxcert.kernels.spec import load_all
    from nbxcert.profiles import get_profile
    from nbxcert.workload import load_workload, workload_keys

    profile = get_profile(args.profile)
    specs = load_all()
    keys = [k[0] if isinstance(k, tuple) else k for k in workload_keys(load_workload(args.workload), profile)]
    keys = keys[: args.keys]
    shipped = ROOT / "certificates" / profile.key
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for way in ("functions", "directory"):
            root = Path(tmp) / way
            shutil.copytree(shipped, root / profile.key)
            if way == "functions":

                def lookup(kernel, dtype, text, root=root):
                    return certificates.existing_entry(root, profile.key, kernel, dtype, text)

                def add(kernel, dtype, text, entry, root=root):
                    certificates.add_entry(root, profile.key, kernel, dtype, text, entry)

            else:
                written = certificates.Directory(root)

                def lookup(kernel, dtype, text, written=written):
                    return written.existing_entry(profile.key, kernel, dtype, text)

                def add(kernel, dtype, text, entry, written=written):
                    written.add_entry(profile.key, kernel, dtype, text, entry)

            results[way] = _run(root, keys, specs, profile, lookup, add)
            r = results[way]
            print(
                f"{way:9s}: lookups {r['lookups_ms_a_key']:6.1f} ms a key, write {r['write_ms_a_key']:6.1f} ms a key "
                f"({r['written']} of {len(keys)} keys written)",
                flush=True,
            )
        same = all(  # both ways must leave the same files
            (Path(tmp) / "functions" / profile.key / p.name).read_bytes() == p.read_bytes()
            for p in (Path(tmp) / "directory" / profile.key).glob("*.json")
        )
    print(f"files identical: {same}")
    if args.out:
        doc = {"workload": args.workload, "profile": profile.key, "keys": len(keys), "identical": same, **results}
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
