"""`nbxcert doctor`, `--version` and `--help`, run as a user runs them (a subprocess), exit codes and lines asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from nbxcert import __version__


def nbx(*args, env=None, timeout=300):
    # doctor's own choice is under test, in a user's environment: neither variable set (TRITON_INTERPRET left set
    # hid a refusal: doctor imported Triton before choosing the interpreter, which then refused a compiled Triton)
    full_env = {k: v for k, v in os.environ.items() if k not in ("NBXCERT_BACKEND", "TRITON_INTERPRET")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "nbxcert", *args], capture_output=True, text=True, timeout=timeout, env=full_env
    )


def test_version_and_help():
    r = nbx("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"nbxcert {__version__}"
    for cmd in ([], ["doctor"], ["kernels"], ["profiles"]):
        r = nbx(*cmd, "--help")
        assert r.returncode == 0, (cmd, r.stderr)
        assert "Usage" in r.stdout


def test_doctor_json_tells_the_truth_about_this_machine():
    from nbxcert.kernels.backends import cuda

    r = nbx("doctor", "--json")
    report = json.loads(r.stdout)
    has_gpu = cuda.available()[0]
    assert report["backend"] == ("cuda" if has_gpu else "interpreter")
    assert r.returncode == (0 if report["backend_usable"] else 1)
    assert report["versions"]["nbxcert"] == __version__
    assert isinstance(report["torch_importable"], bool)
    assert report["oracle_products"].startswith("numpy on the host")  # the default, GPU or not
    if has_gpu:
        assert report["cuda_gpus"] and report["cuda_gpus"][0]["profile"].startswith("nvidia/")
    else:
        assert report["cuda_gpus"] == []
        assert "no usable NVIDIA GPU" in report["backend_reason"]


@pytest.mark.skipif(os.path.exists("/dev/nvidia0"), reason="this case is the machine without a GPU")
def test_doctor_table_without_gpu():
    r = nbx("doctor")
    assert r.returncode == 0, r.stderr
    for line in ("backend", "interpreter", "no usable NVIDIA GPU", "triton", "numpy", "torch importable"):
        assert line in r.stdout
    assert "Traceback" not in r.stdout + r.stderr


@pytest.mark.gpu
def test_doctor_on_a_gpu_names_card_profile_and_versions():
    r = nbx("doctor")
    assert r.returncode == 0, r.stderr
    for line in ("backend", "cuda", "compute capability", "profile", "driver / CUDA", "certified keys"):
        assert line in r.stdout
    report = json.loads(nbx("doctor", "--json").stdout)
    gpu = report["cuda_gpus"][0]
    assert gpu["profile_match"] in ("exact", "family", "declared")
    assert any(g["vendor"] == "NVIDIA" and g["runtime_loads"] for g in report["pci_gpus"])


def test_doctor_with_forced_bad_backend_exits_1_with_one_line():
    r = nbx("doctor", env={"NBXCERT_BACKEND": "tpu"})
    assert r.returncode == 1
    assert "NBXCERT_BACKEND=tpu is not a backend" in r.stdout
    assert "Traceback" not in r.stderr


@pytest.mark.skipif(os.path.exists("/dev/nvidia0"), reason="this case is the machine without a GPU")
def test_device_products_without_a_gpu_are_refused_before_any_work(tmp_path):
    """certify names the float64 product its oracles use; the GPU's, asked for where there is none, is one line."""
    env = {"NBXCERT_BACKEND": "interpreter", "TRITON_INTERPRET": "1"}
    key = ("--key", "rmsnorm[n_cols=64,n_rows=4;float16,float16]@v1", "--out", str(tmp_path / "c"))
    r = nbx("certify", "--profile", "interpreter", *key, env={**env, "NBXCERT_ORACLE_PRODUCTS": "device"})
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "cuBLAS products need an NVIDIA GPU" in r.stderr and not (tmp_path / "c").exists()
    r = nbx("doctor", "--json", env={**env, "NBXCERT_ORACLE_PRODUCTS": "device"})
    assert json.loads(r.stdout)["oracle_products"].startswith("unusable: NBXCERT_ORACLE_PRODUCTS=device")


def test_error_is_one_line_and_debug_shows_traceback():
    r = nbx("kernels", env={"NBXCERT_BACKEND": "tpu"})
    assert r.returncode == 1
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("nbxcert: backend unavailable: NBXCERT_BACKEND=tpu")
    r = nbx("kernels", env={"NBXCERT_BACKEND": "tpu", "NBXCERT_DEBUG": "1"})
    assert r.returncode != 0 and "Traceback" in r.stderr


@pytest.mark.skipif(os.path.exists("/dev/nvidia0"), reason="this case is the machine without a GPU")
@pytest.mark.parametrize("value", ["cuda", "nvidia"])
def test_doctor_without_a_usable_backend_names_the_next_step(value):
    # bug: `NBXCERT_BACKEND=cuda nbxcert doctor` with no GPU (or `=nvidia`) exited 1 with the reason and no next step:
    # the error's own hint ("run `nbxcert doctor`") was dropped, and nothing took its place
    r = nbx("doctor", "--json", env={"NBXCERT_BACKEND": value})
    report = json.loads(r.stdout)
    assert r.returncode == 1 and not report["backend_usable"]
    assert any("set NBXCERT_BACKEND=interpreter to run on the CPU, or unset it" in a for a in report["advice"]), report
    r = nbx("doctor", env={"NBXCERT_BACKEND": value})
    assert r.returncode == 1 and "next step" in r.stdout and "set NBXCERT_BACKEND=interpreter" in r.stdout


def test_doctor_names_the_serving_settings_a_process_refuses_or_skips(tmp_path):
    # bug: doctor said nothing of NBXCERT_CERTIFIED_ONLY=yes (read as off), NBXCERT_UNCERTIFIED=bogus (an application's
    # first launch raises), nor of NBXCERT_CERTIFIED_DIR naming a directory that is not there or a file (serving skips
    # them): "read from <the shipped directory>" and exit 0, as if all were well
    (tmp_path / "file").write_text("not a directory\n")
    env = {
        "NBXCERT_BACKEND": "interpreter",
        "NBXCERT_CERTIFIED_ONLY": "yes",
        "NBXCERT_STRICT_PROVENANCE": "true",
        "NBXCERT_UNCERTIFIED": "bogus",
        "NBXCERT_CERTIFIED_DIR": f"{tmp_path / 'missing'}:{tmp_path / 'file'}",
        "NBXCERT_CACHE_DIR": str(tmp_path / "cache"),
    }
    r = nbx("doctor", "--json", env=env)
    report = json.loads(r.stdout)
    problems, advice = "\n".join(report["problems"]), "\n".join(report["advice"])
    for says in (
        "NBXCERT_CERTIFIED_ONLY=yes is neither 1 (on) nor 0 (off)",
        "NBXCERT_STRICT_PROVENANCE=true is neither 1 (on) nor 0 (off)",
        "NBXCERT_UNCERTIFIED=bogus is not a mode",
        f"certificate directory {tmp_path / 'missing'} (NBXCERT_CERTIFIED_DIR) does not exist; serving skips it",
        f"certificate directory {tmp_path / 'file'} (NBXCERT_CERTIFIED_DIR) is not a directory; serving skips it",
    ):
        assert says in problems, problems
    for says in (
        "set NBXCERT_CERTIFIED_ONLY=1",
        "NBXCERT_UNCERTIFIED: set it to one of sweep, default",
        "fix NBXCERT_CERTIFIED_DIR",
    ):
        assert says in advice, advice
    assert report["serving"]["cache_dir"] == str(tmp_path / "cache") and report["serving"]["cache_writable"]
    good = {
        **env,
        "NBXCERT_CERTIFIED_ONLY": "1",
        "NBXCERT_STRICT_PROVENANCE": "",
        "NBXCERT_UNCERTIFIED": "default",
        "NBXCERT_CERTIFIED_DIR": "",
    }
    r = nbx("doctor", "--json", env=good)
    assert r.returncode == 0 and json.loads(r.stdout)["problems"] == [], r.stdout
    r = nbx("doctor", env=good)
    assert "certified-only on (NBXCERT_CERTIFIED_ONLY); strict provenance off" in r.stdout
    assert "a key with no certificate: default (NBXCERT_UNCERTIFIED)" in r.stdout
