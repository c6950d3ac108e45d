"""Provenance on serving: a certification made with another Triton major, driver major or device profile is served
with one notice, or refused (`ProvenanceMismatch`) under NBXCERT_STRICT_PROVENANCE=1; `nbxcert doctor` counts them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clitools import check
from reliabilitytools import (
    ROOT,
    nbx,
)


def _triton_version() -> str:
    import triton

    return triton.__version__


ELSEWHERE = {  # provenance fields -> what the notice / the refusal says
    "triton": ({"triton": "2.3.1"}, "made with Triton 2.x, this machine has Triton"),
    "driver": ({"driver": "570.124.06"}, "made with driver 570, this machine's driver is none"),
    "profile": (
        {"backend": "cuda", "compute_capability": "9.0", "gpu": "NVIDIA H200", "gpu_memory_bytes": 150_754_820_096},
        "made on a nvidia/hopper device, this machine runs cpu/interpreter",
    ),
}


@pytest.fixture
def serving(monkeypatch, tmp_path):
    from nbxcert import serving

    monkeypatch.setenv("NBXCERT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("NBXCERT_STRICT_PROVENANCE", raising=False)
    yield serving
    serving.configure()


def _probe_dir(certs, root: Path, **by_n) -> Path:
    """fault_probe certifications of n -> provenance overrides, under `root` (cpu/interpreter)."""
    certs.write_probe(root, {certs.probe_key(n): certs.probe_entry(n, **prov) for n, prov in by_n.items()})
    return root


def test_a_certification_made_here_is_served_without_a_word(faulty, certs, serving, tmp_path, capfd):
    root = _probe_dir(certs, tmp_path / "certs", **{"300": {"triton": _triton_version()}})
    serving.configure(dirs=[root], certified_only=True)
    assert serving.config_for(faulty.SPEC, {"n": 300}, ("float32",))["FAULT"] == 0
    assert "notice" not in capfd.readouterr().err


@pytest.mark.parametrize("what", sorted(ELSEWHERE))
def test_a_certification_made_elsewhere_is_served_with_one_notice_or_refused_when_strict(
    what, faulty, certs, serving, tmp_path, capfd, monkeypatch
):
    from nbxcert.errors import ProvenanceMismatch

    provenance, says = ELSEWHERE[what]
    root = _probe_dir(certs, tmp_path / "certs", **{str(n): provenance for n in (300, 301, 302)})
    serving.configure(dirs=[root], certified_only=True)
    for n in (300, 301, 302):
        assert serving.config_for(faulty.SPEC, {"n": n}, ("float32",))["FAULT"] == 0
    notices = [line for line in capfd.readouterr().err.splitlines() if "notice" in line]
    assert len(notices) == 1 and says in notices[0] and "NBXCERT_STRICT_PROVENANCE=1" in notices[0], notices

    monkeypatch.setenv("NBXCERT_STRICT_PROVENANCE", "1")
    serving.configure(dirs=[root], certified_only=True)
    with pytest.raises(ProvenanceMismatch) as e:
        serving.config_for(faulty.SPEC, {"n": 300}, ("float32",))
    assert certs.probe_key(300) in str(e.value) and says in str(e.value)
    assert "nbxcert certify --profile interpreter" in e.value.hint


def test_strict_provenance_on_the_command_line_is_one_line_naming_key_and_difference(certs, tmp_path):
    shipped = json.loads((ROOT / "certificates" / "cpu" / "interpreter" / "rmsnorm.float16.json").read_text())
    key, entry = next(iter(shipped["entries"].items()))
    entry["provenance"]["triton"] = "2.3.1"
    certs.write_file(tmp_path, {key: entry}, kernel="rmsnorm", dtype="float16", profile="cpu/interpreter")
    args = ("verify", "--profile", "interpreter", "--key", key, "--dir", tmp_path, "--certified-only")
    env = {"NBXCERT_CACHE_DIR": str(tmp_path / "cache")}
    r = nbx(*args, env=env)
    check(r, 0, must=["notice: serving cpu/interpreter certifications made with Triton 2.x", "1 served"])
    r = nbx(*args, env={**env, "NBXCERT_STRICT_PROVENANCE": "1"})
    check(r, 1, must=[f"nbxcert: provenance mismatch: kernel rmsnorm: the certification of {key}", "Triton 2.x"])
    assert len([line for line in r.stderr.splitlines() if line.startswith("nbxcert:")]) == 1


def _shipped_entries(profile: str) -> int:
    """How many entries the shipped certificates hold for `profile` (read here from the JSON files themselves)."""
    from importlib import resources

    root = resources.files("nbxcert.shipped_certificates").joinpath(*profile.split("/"))
    if not root.is_dir():
        return 0
    return sum(len(json.loads(f.read_text())["entries"]) for f in root.iterdir() if f.name.endswith(".json"))


def test_doctor_lists_the_certificates_that_apply_here_and_the_ones_it_rejects(certs, tmp_path):
    mine = tmp_path / "mine"
    _probe_dir(
        certs,
        mine,
        **{"300": {"triton": _triton_version()}, "301": ELSEWHERE["triton"][0], "302": ELSEWHERE["driver"][0]},
    )
    certs.write_file(mine, {certs.key(): certs.entry()})  # nvidia/hopper: another machine's profile
    env = {"NBXCERT_CERTIFIED_DIR": str(mine), "NBXCERT_CACHE_DIR": str(tmp_path / "cache")}
    r = nbx("doctor", "--json", env=env)
    check(r, 0)
    doc = json.loads(r.stdout)["certificates"]
    assert doc["machine"]["profile"] == "cpu/interpreter" and doc["machine"]["driver_major"] == "none"
    assert doc["dirs"][0] == str(mine)
    here = doc["profiles"]["cpu/interpreter"]
    assert here["rejected"] == 2 and here["apply"] >= 1  # the shipped certificates apply too
    triton_here = _triton_version().split(".")[0]
    assert here["reasons"] == {f"{ELSEWHERE['triton'][1]} {triton_here}.x": 1, ELSEWHERE["driver"][1]: 1}
    assert sorted(r["key"] for r in doc["rejected"]) == [certs.probe_key(301), certs.probe_key(302)]
    # the fixture's entry plus the shipped Hopper certificates: none applies on this machine
    n = 1 + _shipped_entries("nvidia/hopper")
    hopper = doc["profiles"]["nvidia/hopper"]
    assert hopper == {
        "apply": 0,
        "rejected": n,
        "reasons": {"for nvidia/hopper, not this machine's profile cpu/interpreter": n},
    }
    r = nbx("doctor", env={**env, "COLUMNS": "250"})
    check(
        r,
        0,
        must=[
            "certificates nvidia/hopper",
            f"0 apply, {n} rejected: for nvidia/hopper, not this machine's profile cpu/interpreter ({n})",
            "certificates cpu/interpreter",
            "made with driver 570, this machine's driver is none (1)",
            "2 of this machine's profile (served with a notice)",
        ],
    )


@pytest.mark.gpu
def test_on_the_gpu_the_driver_major_is_compared(backend):
    from nbxcert import serving
    from nbxcert.kernels.backends import cuda
    from nbxcert.profiles import match_nvidia
    from nbxcert.serving import nvidia_driver_version

    if backend.name != "cuda":
        pytest.skip("needs the cuda backend")
    info = cuda.device_info(0)
    here = serving.this_machine(match_nvidia(info.compute_capability)[0].key)
    assert here.driver_major == nvidia_driver_version().split(".")[0] and here.driver_major.isdigit()
    made = {
        "backend": "cuda",
        "compute_capability": ".".join(map(str, info.compute_capability)),
        "triton": _triton_version(),
        "driver": nvidia_driver_version(),
    }
    assert serving.provenance_differences(made, here) == []
    older = {**made, "driver": f"{int(here.driver_major) - 1}.0.0"}
    assert serving.provenance_differences(older, here) == [
        f"made with driver {int(here.driver_major) - 1}, this machine's driver is {here.driver_major}"
    ]


def test_older_code_names_the_entries_certify_would_sweep_again():
    """`coverage` reports certified keys whose entry was made by code that has changed since: by the code digest when
    the entry holds one, else by nbxcert's version."""
    from nbxcert import __version__
    from nbxcert.certify import older_code
    from nbxcert.fingerprint import code_digest
    from nbxcert.kernels.spec import get_spec, load_all
    from nbxcert.keys import parse_key
    from nbxcert.profiles import get_profile

    load_all()
    profile = get_profile("cpu/interpreter")
    keys = [parse_key(f"rmsnorm[n_cols={n},n_rows=4;float16,float16]@v1") for n in (64, 128, 256, 512, 1024)]
    now = code_digest(get_spec("rmsnorm"), profile)
    provenances = [
        {"code": now, "nbxcert": "0.0.1"},  # the same code, whatever the version
        {"code": "0" * 16, "nbxcert": __version__},  # other code
        {"nbxcert": __version__},  # no digest: this version
        {"nbxcert": "0.0.1"},  # no digest: another version
    ]
    entries = {k.text(): {"provenance": p} for k, p in zip(keys, provenances, strict=False)}  # the 5th: not certified
    assert older_code(profile, entries, keys) == [keys[1].text(), keys[3].text()]


def test_doctor_applies_a_keys_entry_of_this_machines_class_beside_another_classs(certs, tmp_path):
    """A key holding an entry of this machine's memory class beside one of another class applies here; a key with
    only another class's entry is rejected, naming the classes it holds."""
    k, e = certs.probe_key, certs.probe_entry
    mine = tmp_path / "mine"
    here = e(310, triton=_triton_version())
    both = dict(here, memory_class="80GB", other_classes={"cpu": here})
    certs.write_probe(mine, {k(310): both, k(311): dict(e(311, triton=_triton_version()), memory_class="80GB")})
    env = {"NBXCERT_CERTIFIED_DIR": str(mine), "NBXCERT_CACHE_DIR": str(tmp_path / "cache")}
    r = nbx("doctor", "--json", env=env)
    check(r, 0)
    doc = json.loads(r.stdout)["certificates"]
    rejected = {r["key"]: r["reasons"] for r in doc["rejected"]}
    assert k(310) not in rejected
    assert rejected[k(311)] == ["memory class 80GB, this machine's is cpu"]
