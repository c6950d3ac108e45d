"""`nbxcert bundle` as a user meets it: every bad input refused in one line on stderr before anything is compiled
(exit 1), nothing written; `--check` on a file that is no bundle refused by name. What a bundle holds, its reading and
the check's verdicts are tested in tests/engine/test_bundle.py (those compile)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from clitools import check
from typer.testing import CliRunner

from nbxcert import cli

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "certificates"
RMSNORM = "rmsnorm[n_cols=2048,n_rows=1024;float16,float16]@v1"  # certified in the shipped Hopper certificates
UNCERTIFIED = "rmsnorm[n_cols=64,n_rows=8;float16,float16]@v1"  # a key no Hopper certificate holds


@pytest.fixture(autouse=True, scope="module")
def _interpreter(backend):
    """The backend is fixed before `bundle` runs in this process (it would fix the cross-compiling one)."""
    if backend.name != "interpreter":
        pytest.skip("the CPU command line (the interpreter profile)")


def nbx(*args) -> SimpleNamespace:
    env = {k: None for k in os.environ if k.startswith("NBXCERT_")}
    r = CliRunner().invoke(cli.app, ["bundle", *map(str, args)], env=env)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return SimpleNamespace(stdout=r.stdout, stderr=r.stderr, returncode=r.exit_code)


def refused(r, *lines: str) -> None:
    text = check(r, 1, must=lines)
    errors = [x for x in r.stderr.splitlines() if x.startswith("nbxcert: ")]
    assert len(errors) == 1, text


def test_inputs_are_checked_before_any_work(tmp_path):
    out = tmp_path / "hopper.nbxbundle"
    empty = tmp_path / "empty"
    empty.mkdir()
    refused(nbx("--key", RMSNORM, "--out", out), "nbxcert: usage: no profile: give --profile P")
    refused(nbx("--profile", "hopper", "--key", RMSNORM), "no bundle file to write: give --out FILE")
    refused(nbx("--profile", "hopper", "--out", out), "no keys asked for")
    refused(nbx("--profile", "nosuch", "--key", RMSNORM, "--out", out), "nbxcert: unknown profile")
    refused(nbx("--profile", "interpreter", "--workload", "demo", "--out", out), "compiles nothing to check")
    refused(nbx("--profile", "hopper", "--key", RMSNORM, "--dir", tmp_path / "no", "--out", out), "no such directory")
    refused(nbx("--profile", "hopper", "--key", RMSNORM, "--out", out, "--jobs", "0"), "--jobs 0")
    refused(nbx("--profile", "hopper", "--key", RMSNORM, "--out", tmp_path), "is a directory")
    refused(nbx("--profile", "hopper", "--key", RMSNORM, "--out", tmp_path / "no" / "b.nbxbundle"), "does not exist")
    refused(nbx("--profile", "hopper", "--key", "rmsnorm[n_cols=64;float16,float16]@v1", "--out", out), "bad launch")
    r = nbx("--profile", "hopper", "--key", UNCERTIFIED, "--dir", empty, "--out", out)
    refused(r, "nbxcert: key not certified: none of the 1 keys asked for has a usable certificate for nvidia/hopper")
    assert not out.exists() and not list(tmp_path.glob(".*.tmp"))


def test_keys_certified_but_none_usable_say_why_the_first_was_refused(tmp_path):
    """Every key asked for is certified but refused (here its winner is no candidate of the kernel's): the error names
    the first refused key and why, not a call to certify keys that are certified."""
    import json

    doc = json.loads((SHIPPED / "nvidia" / "hopper" / "rmsnorm.float16.json").read_text())
    entry = doc["entries"][RMSNORM]
    entry.pop("other_classes", None)
    for row in [entry["winner"]] + [f for f in entry["finalists"] if f["config"] == entry["winner"]["config"]]:
        row["config"]["kwargs"]["ROWS"] = 3  # its own row of finalists too: the winner is chosen from them
    doc["entries"] = {RMSNORM: entry}
    mine = tmp_path / "certs" / "nvidia" / "hopper"
    mine.mkdir(parents=True)
    (mine / "rmsnorm.float16.json").write_text(json.dumps(doc))
    out = tmp_path / "b.nbxbundle"
    r = nbx("--profile", "hopper", "--key", RMSNORM, "--dir", tmp_path / "certs", "--out", out)
    refused(r, "none of the 1 keys asked for can be bundled for nvidia/hopper", f"1 refused, the first {RMSNORM}: ")
    assert "is not a candidate" in r.stderr and "nbxcert validate DIR" in r.stderr and not out.exists()


def test_a_bundle_holds_cuda_binaries_only():
    import triton.backends

    if "amd" not in triton.backends.backends:
        pytest.skip("this Triton has no AMD backend")
    refused(nbx("--profile", "cdna3", "--key", RMSNORM, "--out", "x.nbxbundle"), "a bundle holds CUDA binaries")


def test_the_check_takes_a_bundle_and_a_certificate_directory(tmp_path):
    junk = tmp_path / "junk.nbxbundle"
    junk.write_bytes(b"NBXBNDL\x01" + b"\xff" * 64)
    refused(nbx("--check", junk, "--dir", SHIPPED, "--out", tmp_path / "x"), "--check reads a bundle")
    refused(nbx("--check", junk), "--check needs the certificate directory")
    refused(nbx("--check", tmp_path / "absent", "--dir", SHIPPED), "no such file")
    refused(nbx("--check", tmp_path, "--dir", SHIPPED), f"--check {tmp_path}: is a directory")
    r = nbx("--check", junk, "--dir", SHIPPED)
    refused(r, f"nbxcert: corrupt bundle: bundle {junk}: declares a manifest of", "over the 67108864-byte limit")
