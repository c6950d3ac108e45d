"""`--hf-config CONFIG.json` on keys, certify, verify, warm, coverage and bundle: the workload of a Hugging Face config
as published (`nbxcert.hf_config`), alone (never with --workload, --keys or --key), every refusal one line and exit 1.

The configs are tests/fixtures/hf_configs/'s; the certificates are the shipped hopper ones (llama-3-8b certified whole).
No kernel runs: every command here stops before launching anything, or never launches (keys, coverage, bundle --check).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from clitools import check
from typer.testing import CliRunner

from nbxcert import cli

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "tests" / "fixtures" / "hf_configs"
LLAMA = CONFIGS / "Meta-Llama-3-8B" / "config.json"
CERTS = ROOT / "certificates"
COMMANDS = {  # each command's arguments besides the keys asked for, as far as it checks them first
    "keys": ["--profile", "hopper"],
    "certify": ["--profile", "interpreter", "--out", "unused"],
    "verify": ["--profile", "interpreter"],
    "warm": ["--profile", "interpreter"],
    "coverage": ["--profile", "hopper", "--dir", CERTS],
    "bundle": ["--profile", "hopper", "--out", "unused.nbxbundle"],
}


@pytest.fixture(autouse=True, scope="module")
def _interpreter(backend):
    if backend.name != "interpreter":
        pytest.skip("the CPU command line (the interpreter profile)")


def nbx(*args, cwd: Path | None = None) -> SimpleNamespace:
    """The command run in this process, with its environment's NBXCERT_* variables cleared first."""
    env = {k: None for k in os.environ if k.startswith("NBXCERT_")}
    env.update({"NBXCERT_BACKEND": "interpreter", "NBXCERT_UNCERTIFIED": "default"})
    here = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        r = CliRunner().invoke(cli.app, [str(a) for a in args], env=env)
    finally:
        os.chdir(here)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return SimpleNamespace(stdout=r.stdout, stderr=r.stderr, returncode=r.exit_code)


def refused(r, *must: str) -> str:
    """Exit 1, no traceback, exactly one `nbxcert:` line on stderr holding every text of `must`; that line."""
    check(r, 1, must=must)
    lines = [x for x in r.stderr.splitlines() if x.startswith("nbxcert:")]
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_keys_of_a_published_config_end_to_end(tmp_path):
    # the installed command in its own process, as a user runs it: the keys file it prints is the shipped llama-3-8b
    # workload's keys at the config's bfloat16
    env = {k: v for k, v in os.environ.items() if not k.startswith("NBXCERT_")}
    env["NBXCERT_BACKEND"] = "interpreter"
    cmd = [sys.executable, "-m", "nbxcert", "keys", "--profile", "hopper", "--hf-config", str(LLAMA), "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    check(r, 0)
    keys = [json.loads(line)["key"] for line in r.stdout.splitlines()]
    shipped = nbx("keys", "--profile", "hopper", "--workload", "llama-3-8b", "--json")
    check(shipped, 0)
    bf16 = [k for k in (json.loads(line)["key"] for line in shipped.stdout.splitlines()) if "bfloat16" in k]
    assert keys == bf16 and len(keys) > 200


def test_a_config_directory_is_read_as_its_config_json():
    by_dir = nbx("keys", "--profile", "hopper", "--hf-config", LLAMA.parent, "--json")
    by_file = nbx("keys", "--profile", "hopper", "--hf-config", LLAMA, "--json")
    assert check(by_dir, 0) == check(by_file, 0)


def coverage_json(*asked) -> dict:
    r = nbx("coverage", "--profile", "hopper", *asked, "--dir", CERTS, "--json")
    check(r, 0)
    return json.loads(r.stdout)


def test_coverage_of_the_config_is_the_shipped_workloads_figure():
    hf = coverage_json("--hf-config", LLAMA)
    shipped = coverage_json("--workload", "llama-3-8b")
    assert hf["fraction"] == shipped["fraction"] == 1.0
    assert hf["certified"] == hf["keys"] and 0 < hf["keys"] < shipped["keys"]  # bfloat16 only, every one certified
    assert set(r["key"] for r in hf["results"]) <= set(r["key"] for r in shipped["results"])


def test_coverage_of_a_model_not_certified_counts_its_missing_keys():
    # Qwen3-8B's intermediate size, vocabulary and q/k norms are no certified workload's: the gate fails, naming them
    r = nbx("coverage", "--profile", "hopper", "--hf-config", CONFIGS / "Qwen3-8B", "--dir", CERTS)
    text = check(r, 1, must=["missing: ", "keys certified"])
    assert "100.0%)" not in text.splitlines()[-1]


def test_bundle_check_takes_the_configs_keys():
    bundle = CERTS / "nvidia" / "hopper" / "hopper.141GB.nbxbundle"
    r = nbx(
        "bundle",
        "--check",
        bundle,
        "--dir",
        CERTS,
        "--profile",
        "hopper",
        "--hf-config",
        LLAMA,
        "--memory-class",
        "141GB",
    )
    check(r, 0, must=["matches its certificates"])


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(
    "other",
    [
        ["--workload", "llama-3-8b"],
        ["--keys", "keys.jsonl"],
        ["--key", "rmsnorm[n_cols=64,n_rows=8;float16,float16]@v1"],
    ],
)
def test_hf_config_with_another_source_of_keys_is_refused(tmp_path, command, other):
    (tmp_path / "keys.jsonl").write_text("")
    r = nbx(command, *COMMANDS[command], "--hf-config", LLAMA, *other, cwd=tmp_path)
    refused(r, "usage: --hf-config cannot be combined with " + other[0])
    assert not (tmp_path / "unused").exists() and not (tmp_path / "unused.nbxbundle").exists()


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_config_it_cannot_map_is_one_line_on_every_command(tmp_path, command):
    path = tmp_path / "m" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps({**json.loads(LLAMA.read_text()), "model_type": "gpt_neox"}))
    line = refused(nbx(command, *COMMANDS[command], "--hf-config", path, cwd=tmp_path), "invalid Hugging Face config")
    assert "field 'model_type'" in line and "'gpt_neox'" in line


@pytest.mark.parametrize(
    "edit, says",
    [
        ({"hidden_act": "relu"}, "field 'hidden_act': 'relu'"),
        ({"num_hidden_layers": None}, "field 'num_hidden_layers': must be a positive integer"),
        ({"rope_interleaved": False}, "field 'rope_interleaved': not a field nbxcert maps"),
    ],
)
def test_a_bad_field_is_one_line_naming_it(tmp_path, edit, says):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(LLAMA.read_text()), **edit}))
    refused(nbx("keys", "--profile", "hopper", "--hf-config", path), says, str(path))


def test_a_missing_field_is_one_line_naming_it(tmp_path):
    config = json.loads(LLAMA.read_text())
    del config["intermediate_size"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    refused(nbx("keys", "--profile", "hopper", "--hf-config", path), "field 'intermediate_size': missing")


def test_no_such_config_is_one_line(tmp_path):
    refused(nbx("keys", "--profile", "hopper", "--hf-config", tmp_path / "none.json"), "does not exist")
