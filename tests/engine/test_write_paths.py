"""Paths: links out of a certificate directory and `..` names are refused; files are written only where asked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from clitools import check
from reliabilitytools import (
    INTERPRETER_ENV,
    nbx,
    probe_text,
)


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_links_out_of_a_certificate_directory_and_dotdot_names_are_refused_by_the_loader(certs, tmp_path):
    from nbxcert import index
    from nbxcert.errors import CertificateInvalid

    outside = tmp_path / "outside"
    outside.mkdir()
    victim = certs.write_probe(outside, {certs.probe_key(1): certs.probe_entry(1)})
    for name, make in (
        ("file link", lambda d: (d / "cpu" / "interpreter" / "fault_probe.float32.json").symlink_to(victim)),
        ("directory link", lambda d: (d / "cpu" / "interpreter").symlink_to(victim.parent)),
    ):
        root = tmp_path / name.replace(" ", "_")
        (root / "cpu").mkdir(parents=True)
        if name == "file link":
            (root / "cpu" / "interpreter").mkdir()
        make(root)
        with pytest.raises(CertificateInvalid, match="points outside the certificate directory"):
            index.load_index([root], "cpu/interpreter", "cpu", cache_dir=tmp_path / "cache")
        check(nbx("validate", root), 1, must=["points outside"])
    root = tmp_path / "dotdot"
    (root / "cpu" / "interpreter").mkdir(parents=True)
    (root / "cpu" / "interpreter" / "fault_probe..float32.json").write_text(probe_text(certs))
    with pytest.raises(CertificateInvalid, match="file name must be"):
        index.load_index([root], "cpu/interpreter", "cpu", cache_dir=tmp_path / "cache")


def test_certify_writes_only_under_out(tmp_path):
    # bug: certify read the certificate through a link pointing out of --out, and wrote through a linked profile
    # directory into another directory than the one it was asked to write
    key = "rmsnorm[n_cols=128,n_rows=2;float16,float16]@v1"
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    before = _tree(tmp_path)
    r = subprocess.run(
        [sys.executable, "-m", "nbxcert", "certify", "--profile", "interpreter", "--key", key, "--out", "certs"],
        cwd=work,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("NBXCERT_")} | INTERPRETER_ENV,
        timeout=300,
    )
    check(r, 0)
    new = _tree(tmp_path) - before
    assert new and all(p.startswith("work/certs") for p in new), sorted(new)
    assert sorted(p for p in new if p.endswith(".json")) == ["work/certs/cpu/interpreter/rmsnorm.float16.json"]

    linked = tmp_path / "linked"
    (linked / "cpu").mkdir(parents=True)
    (linked / "cpu" / "interpreter").symlink_to(outside)
    r = nbx("certify", "--profile", "interpreter", "--key", key, "--out", linked)
    check(r, 1, must=["nbxcert: invalid certificate:", "points outside the certificate directory"])
    assert list(outside.iterdir()) == [], "certify wrote through a link out of --out"

    (outside / "rmsnorm.float16.json").write_text("not even JSON")
    (linked / "cpu" / "interpreter").unlink()
    (linked / "cpu" / "interpreter").mkdir()
    (linked / "cpu" / "interpreter" / "rmsnorm.float16.json").symlink_to(outside / "rmsnorm.float16.json")
    r = nbx("certify", "--profile", "interpreter", "--key", key, "--out", linked)
    check(r, 1, must=["points outside the certificate directory"])
    assert (outside / "rmsnorm.float16.json").read_text() == "not even JSON"


def test_merge_writes_only_under_out(certs, tmp_path):
    shard, outside, out = tmp_path / "shard", tmp_path / "outside", tmp_path / "out"
    certs.write_probe(shard, {certs.probe_key(1): certs.probe_entry(1)})
    outside.mkdir()
    (outside / "v.json").write_text("a file outside OUT")
    before = _tree(tmp_path)
    check(nbx("merge", out, shard, "--spec", "faulty_kernels"), 0, must=["merged 1 entries"])
    new = _tree(tmp_path) - before
    assert new and all(p.startswith("out") for p in new), sorted(new)

    for name, make in (
        (
            "file link",
            lambda o: (o / "cpu" / "interpreter" / "fault_probe.float32.json").symlink_to(outside / "v.json"),
        ),
        ("directory link", lambda o: (o / "cpu" / "interpreter").symlink_to(outside)),
    ):
        out = tmp_path / name.replace(" ", "_")
        (out / "cpu").mkdir(parents=True)
        if name == "file link":
            (out / "cpu" / "interpreter").mkdir()
        make(out)
        check(nbx("merge", out, shard, "--spec", "faulty_kernels"), 1, must=["points outside"])
        assert _tree(outside) == {"v.json"} and (outside / "v.json").read_text() == "a file outside OUT", name
