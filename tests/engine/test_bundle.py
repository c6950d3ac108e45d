"""Bundles (`nbxcert bundle`, `nbxcert.serving.bundles`): certified winners cross-compiled for sm_90 on the CPU,
packed into one file, read back, refused when damaged or hostile, and registered with serving.

One bundle is built per module (three certified keys of rmsnorm and matmul, entries copied from the shipped Hopper
certificates into a directory of the test's own); its launches are compiled again independently, in a subprocess
cross-compiling for sm_90 (`tests/crosstools.py`), and each must be found in the bundle with the very cubin and
launch record. Damaged and hostile files are made from its bytes, with the trailer recomputed where the point is that
a check behind it holds too. A bundle of another Triton or target is made by re-serialising its manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from clitools import check
from crosstools import cross_compile
from typer.testing import CliRunner

from nbxcert import bundling
from nbxcert.certificates import own
from nbxcert.errors import BundleCorrupt, ProvenanceMismatch
from nbxcert.keys import parse_key
from nbxcert.profiles import get_profile
from nbxcert.serving import bundles
from nbxcert.serving.bundles import MAGIC, Bundle, canonical, entry_digest, serialize

SHIPPED = Path(__file__).resolve().parents[2] / "certificates" / "nvidia" / "hopper"
RMSNORM = ("rmsnorm[n_cols=2048,n_rows=1024;float16,float16]@v1", "rmsnorm[n_cols=2048,n_rows=128;float16,float16]@v1")
# embedding's copy compiles to one cubin for both tables, whose launch records differ (the parameters' types)
EMBEDDING = {dt: f"embedding[dim=2048,n_tokens=1024;{dt},int32]@v1" for dt in ("float16", "bfloat16")}
KEYS = {  # (kernel, certificate dtype): keys
    ("rmsnorm", "float16"): RMSNORM,
    ("matmul", "float16"): ("matmul[K=2048,M=16,N=2048,aligned=1,trans_a=0,trans_b=1;float16,float16]@v1",),
    **{("embedding", dt): (key,) for dt, key in EMBEDDING.items()},
}
ALL = sorted(k for keys in KEYS.values() for k in keys)
HOPPER = get_profile("hopper")


def write_certificates(root: Path, certs, keys=KEYS) -> Path:
    """Certificates of `keys` under `root`, their entries those the shipped Hopper certificates hold."""
    for (kernel, dtype), texts in keys.items():
        shipped = json.loads((SHIPPED / f"{kernel}.{dtype}.json").read_text())["entries"]
        certs.write_file(root, {k: shipped[k] for k in texts}, kernel=kernel, dtype=dtype)
    return root


@pytest.fixture(autouse=True, scope="module")
def _backend_first(backend):
    """This process's backend is chosen before a build loads the kernels (it would fix the cross-compiling one)."""
    return backend


@pytest.fixture(scope="module")
def certdir(tmp_path_factory, certs) -> Path:
    return write_certificates(tmp_path_factory.mktemp("certs"), certs)


@pytest.fixture(scope="module")
def built(certdir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "hopper.nbxbundle"
    report = bundling.build("hopper", [parse_key(k) for k in ALL], [certdir], out, jobs=2)
    assert report.ok and report.keys == len(ALL) and not report.skipped, report.as_dict()
    return out


@pytest.fixture
def no_bundle_path(monkeypatch):
    monkeypatch.delenv(bundles.ENV_PATH, raising=False)
    monkeypatch.delenv("NBXCERT_STRICT_PROVENANCE", raising=False)
    from nbxcert.serving.notices import forget

    forget()
    yield
    bundles.unregister()
    forget()


def _launches_compiled(items):
    """(In a subprocess cross-compiling for sm_90.) Each item's winner launched at its problem on inputs of the spec's
    own, every kernel launch named and described as serving will ask for it, with the SHA-256 of its cubin."""
    from nbxcert.kernels import recording
    from nbxcert.kernels.backends import binaries, cross
    from nbxcert.kernels.spec import Config, get_spec

    for item in items:
        spec = get_spec(item["spec"])
        inputs = spec.make_inputs(item["problem"], tuple(item["dtypes"]), 0, "cpu")
        with recording.recording() as rec, cross.recording() as launched:
            spec.launch(Config.from_dict(item["config"]), inputs)
        assert len(rec.launches) == len(launched)
        for made, compiled in zip(rec.launches, launched, strict=True):
            identity, source_key = binaries.identity_of(made.kernel)
            yield {
                "key": item["key"],
                "name": [identity, source_key, binaries.specialization_of(made.kernel, made.args, made.kwargs)],
                "sha256": hashlib.sha256(compiled.compiled.asm["cubin"]).hexdigest(),
                "record": binaries.describe(compiled.compiled),
            }


# --- the round trip ---------------------------------------------------------------------------------------------------
def test_a_bundle_for_sm_90_holds_every_launch_of_its_keys_with_its_cubin_and_record(built, certdir):
    import triton

    # each key's first memory class's entry (`own`): another class's beside it is not bundled
    shipped = {k: own(e) for kernel, dtype in KEYS for k, e in _entries(certdir, kernel, dtype).items()}
    with Bundle.open(built) as bundle:
        m = bundle.manifest
        assert (m["schema_version"], m["profile"], m["triton_version"]) == (1, "nvidia/hopper", triton.__version__)
        assert m["target"] == {"backend": "cuda", "arch": 90, "warp_size": 32}
        assert m["ptxas_version"] and "\n" not in m["ptxas_version"]
        assert [k["key"] for k in m["keys"]] == ALL
        for k in m["keys"]:
            assert k["entry_digest"] == entry_digest(shipped[k["key"]])
            assert k["config"] == shipped[k["key"]]["winner"]["config"]
        items = [
            {"key": k, "spec": parse_key(k).kernel, "config": shipped[k]["winner"]["config"], "problem": p}
            | {"dtypes": list(parse_key(k).dtypes)}
            for k in ALL
            for p in shipped[k]["certified_problems"].values()
        ]
        expected = cross_compile(90, _launches_compiled, items, timeout=900)
        assert len(expected) >= len(items)
        for launch in expected:
            found = bundle.lookup(*launch["name"])
            assert found is not None, launch["name"][0]
            assert found.sha256 == launch["sha256"]
            assert dict(found.record) == launch["record"]
            assert found.codes  # a record nbxcert's launcher takes
        bundled = {
            tuple(x[f] for f in ("identity", "source_key", "specialization")) for k in m["keys"] for x in k["launches"]
        }
        assert bundled == {tuple(launch["name"]) for launch in expected}
        assert bundle.lookup("nbxcert.kernels.rows._norm_kernel", "no such source", "nor specialization") is None
        bundle.verify()
        # the bug this guards against: the two tables' launches were refused, their image known with another record
        by_key = {k["key"]: k["launches"] for k in m["keys"]}
        half, bf16 = (by_key[EMBEDDING[dt]] for dt in ("float16", "bfloat16"))
        assert [x["binary"] for x in half] == [x["binary"] for x in bf16]
        assert [x["record"] for x in half] != [x["record"] for x in bf16]


def _entries(root: Path, kernel: str, dtype: str = "float16") -> dict:
    return json.loads((root / "nvidia" / "hopper" / f"{kernel}.{dtype}.json").read_text())["entries"]


def test_the_same_inputs_give_the_same_bytes(built, certdir, tmp_path):
    again = tmp_path / "again.nbxbundle"
    report = bundling.build("hopper", [parse_key(k) for k in reversed(ALL)], [certdir], again, jobs=1)
    assert report.ok
    assert again.read_bytes() == built.read_bytes()


def test_launches_of_other_workloads_add_their_shapes_of_a_key_as_the_workload_does(certdir):
    """`--launches-of W` (`plan(launches_of=...)`) compiles each key also at W's launches of it, as `--workload W`
    does, for keys it does not select: tinyllama-1.1b launches rmsnorm at 96 rows, a member of the 128-row bucket whose
    certified problems are its ends; a key no launch of W makes is left at its certified problems."""
    key = parse_key(RMSNORM[1])
    alone, _, _ = bundling.plan(HOPPER, [key], [certdir])
    more, _, _ = bundling.plan(HOPPER, [key], [certdir], launches_of=["tinyllama-1.1b"])
    as_workload, _, _ = bundling.plan(HOPPER, [key], [certdir], workload="tinyllama-1.1b")
    assert more[0].problems == alone[0].problems + [{"n_rows": 96, "n_cols": 2048}] == as_workload[0].problems
    other, _, _ = bundling.plan(HOPPER, [parse_key(RMSNORM[0])], [certdir], launches_of=["tinyllama-1.1b"])
    assert other[0].problems == bundling.plan(HOPPER, [parse_key(RMSNORM[0])], [certdir])[0][0].problems


def test_check_refuses_launches_of_in_one_line(built, certdir):
    from nbxcert.cli import app

    r = CliRunner().invoke(app, ["bundle", "--check", str(built), "--dir", str(certdir), "--launches-of", "llama-3-8b"])
    assert r.exit_code != 0 and "--out, --jobs and --launches-of are for building one" in r.output, r.output
    assert "Traceback" not in r.output


def test_a_key_without_a_certificate_is_skipped_and_named(built, certdir, tmp_path):
    missing = "rmsnorm[n_cols=4096,n_rows=128;float16,float16]@v1"
    out = tmp_path / "one.nbxbundle"
    report = bundling.build("hopper", [parse_key(missing), parse_key(ALL[-1])], [certdir], out, jobs=1)
    assert report.ok and report.skipped == [missing] and report.keys == 1
    assert "1 of 2 keys skipped" in report.line()


# --- damaged and hostile files ----------------------------------------------------------------------------------------
def _retrailed(data: bytes) -> bytes:
    """`data` with its trailer made right again (what a forger does)."""
    body = data[:-32]
    return body + hashlib.sha256(body).digest()


def _manifest_of(data: bytes) -> tuple[dict, int]:
    (length,) = struct.unpack_from("<Q", data, 8)
    return json.loads(data[16 : 16 + length]), length


def _with_manifest(data: bytes, raw: bytes) -> bytes:
    _, length = _manifest_of(data)
    body = MAGIC + struct.pack("<Q", len(raw)) + raw + data[16 + length : -32]
    return body + hashlib.sha256(body).digest()


def _first_binary_at(data: bytes) -> int:
    _, length = _manifest_of(data)
    return 16 + length + 8


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


def _hostile(data: bytes, case: str) -> bytes:
    manifest, _ = _manifest_of(data)
    if case == "a binary byte":
        return _flip(data, _first_binary_at(data) + 100)
    if case == "a manifest byte":
        return _flip(data, 40)
    if case == "the trailer":
        return _flip(data, len(data) - 1)
    if case == "truncated":
        return data[:-1000]
    if case == "a few bytes":
        return data[:20]
    if case == "another magic":
        return b"NBXIDX\x00\x01" + data[8:]
    if case == "a huge manifest length":
        return data[:8] + struct.pack("<Q", 2**62) + data[16:]
    if case == "a manifest length past the end":
        return data[:8] + struct.pack("<Q", len(data)) + data[16:]
    if case == "a huge binary length, trailer forged":
        at = _first_binary_at(data) - 8
        return _retrailed(data[:at] + struct.pack("<Q", 2**40) + data[at + 8 :])
    if case == "bytes after the last binary, trailer forged":
        return _retrailed(data[:-32] + b"\0" * 8 + data[-32:])
    if case == "broken JSON, trailer forged":
        return _with_manifest(data, canonical(manifest)[:-1])
    if case == "a manifest not in canonical form, trailer forged":
        return _with_manifest(data, json.dumps(manifest, sort_keys=True, indent=1).encode())
    if case == "an unknown field, trailer forged":
        return _with_manifest(data, canonical({**manifest, "run_me": "import os"}))
    if case == "another schema version, trailer forged":
        return _with_manifest(data, canonical({**manifest, "schema_version": 2}))
    if case == "a launch naming a binary not in it, trailer forged":
        manifest["keys"][0]["launches"][0]["binary"] = "0" * 64
        return _with_manifest(data, canonical(manifest))
    if case == "a record the launcher cannot take, trailer forged":
        manifest["records"][0]["record"]["signature"][0][1] = "i128"
        return _with_manifest(data, canonical(manifest))
    if case == "a symbol that is no name, trailer forged":
        manifest["records"][0]["record"]["name"] = "../../libc.so"
        return _with_manifest(data, canonical(manifest))
    if case == "a record changed behind its digest, trailer forged":
        manifest["records"][0]["record"]["shared"] += 1024
        return _with_manifest(data, canonical(manifest))
    if case == "a stored size the manifest does not say, trailer forged":
        manifest["binaries"][0]["stored"] += 1
        return _with_manifest(data, canonical(manifest))
    raise AssertionError(case)


REFUSED = {
    "a binary byte": "fails its SHA-256 trailer",
    "a manifest byte": "fails its SHA-256 trailer",
    "the trailer": "fails its SHA-256 trailer",
    "truncated": "fails its SHA-256 trailer",
    "a few bytes": "shorter than any bundle",
    "another magic": "does not start with the bundle magic",
    "a huge manifest length": "over the 67108864-byte limit",
    "a manifest length past the end": "past the end of its",
    "a huge binary length, trailer forged": "over the 67108864-byte limit",
    "bytes after the last binary, trailer forged": "bytes after its last binary",
    "broken JSON, trailer forged": "manifest is not valid JSON",
    "a manifest not in canonical form, trailer forged": "not in canonical form",
    "an unknown field, trailer forged": "'run_me' is not a field of a bundle manifest",
    "another schema version, trailer forged": "schema_version 2 is not 1",
    "a launch naming a binary not in it, trailer forged": "no binary 0000000000000000 in the bundle",
    "a record the launcher cannot take, trailer forged": "a launch record nbxcert cannot launch",
    "a symbol that is no name, trailer forged": "must be a kernel symbol",
    "a record changed behind its digest, trailer forged": "'records[0].sha256' is not the SHA-256 of its record",
    "a stored size the manifest does not say, trailer forged": "its manifest entry says",
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_damaged_or_hostile_bundle_is_refused_naming_the_file(built, tmp_path, case):
    path = tmp_path / "bad.nbxbundle"
    path.write_bytes(_hostile(built.read_bytes(), case))
    with pytest.raises(BundleCorrupt) as refused:
        Bundle.open(path)
    assert str(path) in refused.value.message and REFUSED[case] in refused.value.message


def test_a_binary_changed_behind_a_forged_trailer_is_refused_before_it_is_handed_out(built, tmp_path):
    data = built.read_bytes()
    manifest, _ = _manifest_of(data)
    path = tmp_path / "forged.nbxbundle"
    path.write_bytes(_retrailed(_flip(data, _first_binary_at(data) + 100)))
    first = manifest["binaries"][0]["sha256"]
    launch = next(x for k in manifest["keys"] for x in k["launches"] if x["binary"] == first)
    # a changed compressed byte fails the stream, its length or its digest: each named, none handed out
    changed = f"{path}: binary {first[:16]} (does not match its SHA-256|is not a zlib stream|does not inflate)"
    with Bundle.open(path) as bundle:  # the structure holds: the file opens
        with pytest.raises(BundleCorrupt, match=changed):
            bundle.lookup(launch["identity"], launch["source_key"], launch["specialization"])
        with pytest.raises(BundleCorrupt, match="does not match its SHA-256|is not a zlib stream|does not inflate"):
            bundle.verify()


def test_a_binary_that_inflates_past_its_declared_size_is_refused(built, tmp_path, monkeypatch):
    """A hostile stream (here a real image with the manifest's `size` lowered to 10 bytes) stops at the declared size:
    no more than size + 1 bytes are ever inflated (a spy on the inflater counts them), not the whole image."""
    import zlib

    data = built.read_bytes()
    manifest, _ = _manifest_of(data)
    assert manifest["binaries"][0]["size"] > 1000
    manifest["binaries"][0]["size"] = 10
    path = tmp_path / "bomb.nbxbundle"
    path.write_bytes(_with_manifest(data, canonical(manifest)))
    first = manifest["binaries"][0]["sha256"]
    inflated: list[int] = []
    real = zlib.decompressobj

    class Spy:
        def __init__(self, *args):
            self._inner = real(*args)

        def __getattr__(self, name):
            return getattr(self._inner, name)

        def decompress(self, *args):
            out = self._inner.decompress(*args)
            inflated.append(len(out))
            return out

    monkeypatch.setattr(zlib, "decompressobj", Spy)
    with Bundle.open(path) as bundle, pytest.raises(BundleCorrupt, match=f"binary {first[:16]} does not inflate"):
        bundle.image(first)
    assert inflated and max(inflated) <= 11


def test_what_is_not_a_regular_file_is_refused(tmp_path):
    os.mkfifo(tmp_path / "fifo.nbxbundle")
    (tmp_path / "dir.nbxbundle").mkdir()
    for name in ("fifo.nbxbundle", "dir.nbxbundle"):
        with pytest.raises(BundleCorrupt, match="is not a regular file"):
            Bundle.open(tmp_path / name)
    with pytest.raises(BundleCorrupt, match="cannot be read"):
        Bundle.open(tmp_path / "absent.nbxbundle")


def test_a_bundle_is_never_written_from_an_image_that_is_not_the_one_named(built):
    data = built.read_bytes()
    manifest, _ = _manifest_of(data)
    images = {b["sha256"]: b"\0" * b["size"] for b in manifest["binaries"]}
    with pytest.raises(BundleCorrupt, match="is not the one named"):
        serialize(manifest, images)


# --- serving ----------------------------------------------------------------------------------------------------------
def _variant(built: Path, where: Path, **changes) -> Path:
    """The bundle `built` with manifest fields changed (a valid bundle of another Triton or target), at `where`."""
    data = built.read_bytes()
    manifest, _ = _manifest_of(data)
    manifest.update(changes)
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_bytes(_with_manifest(data, canonical(manifest)))
    return where


def _a_launch(path: Path) -> tuple[str, str, str]:
    with Bundle.open(path) as bundle:
        x = bundle.keys[0]["launches"][0]
        return x["identity"], x["source_key"], x["specialization"]


def test_serving_registers_the_bundles_on_its_search_path(built, tmp_path, no_bundle_path, capsys):
    from nbxcert.kernels.backends import binaries

    certdir = tmp_path / "certs"
    (certdir / "nvidia" / "hopper").mkdir(parents=True)
    (certdir / "nvidia" / "hopper" / "hopper.nbxbundle").write_bytes(built.read_bytes())
    source = bundles.register(HOPPER, [certdir], strict=False)
    assert source is not None and binaries.source() is source
    found = source(*_a_launch(built))
    assert found is not None and found.image
    assert "[nbxcert] compiled winners:" in capsys.readouterr().err
    bundles.unregister()
    assert binaries.source() is None


def test_serving_leaves_the_bundles_named_for_another_memory_class_unopened(tmp_path, no_bundle_path, monkeypatch):
    """A card is served its own class's winners: `<name>.<class>.nbxbundle` of the profile's other classes is not
    opened (an H200 does not read the H100's bundles); class-less names, this class's, and files named on
    NBXCERT_BUNDLE_PATH are read."""
    base = tmp_path / "nvidia" / "hopper"
    base.mkdir(parents=True)
    names = ["llama-3-8b.nbxbundle", "llama-3-8b.80GB.nbxbundle", "qwen2.5-7b.nbxbundle", "x.141GB.nbxbundle"]
    for n in names:
        (base / n).write_bytes(b"")
    named = tmp_path / "mine.80GB.nbxbundle"
    named.write_bytes(b"")
    got = [p.name for p in bundles.bundle_files("nvidia/hopper", [tmp_path], ["80GB"])]
    assert got == ["llama-3-8b.nbxbundle", "qwen2.5-7b.nbxbundle", "x.141GB.nbxbundle"]
    assert [p.name for p in bundles.bundle_files("nvidia/hopper", [tmp_path])] == sorted(names)
    monkeypatch.setenv(bundles.ENV_PATH, str(named))
    assert bundles.bundle_files("nvidia/hopper", [], ["80GB"]) == [named]


def test_a_bundle_place_the_os_cannot_reach_is_skipped_not_a_crash(tmp_path, no_bundle_path, capsys, monkeypatch):
    """A certificate directory or an NBXCERT_BUNDLE_PATH entry the OS cannot be asked about (here a name too long;
    a directory on the way that cannot be searched is the same PermissionError) is skipped as the certificate index
    skips it, the search-path entry with one notice naming why: it raised from `Path.is_dir` and ended the start."""
    far = tmp_path / ("d" * 300)
    assert bundles.bundle_files("nvidia/hopper", [far]) == []
    monkeypatch.setenv(bundles.ENV_PATH, str(far / "mine.nbxbundle"))
    assert bundles.bundle_files("nvidia/hopper", []) == []
    err = capsys.readouterr().err
    assert "NBXCERT_BUNDLE_PATH names " in err and "which cannot be reached (File name too long); it is skipped" in err


def test_a_bundle_of_another_triton_is_ignored_with_one_notice(built, tmp_path, no_bundle_path, capsys, monkeypatch):
    from nbxcert.kernels.backends import binaries

    other = _variant(built, tmp_path / "old.nbxbundle", triton_version="3.5.0")
    monkeypatch.setenv(bundles.ENV_PATH, str(other))
    assert bundles.register(HOPPER, [], strict=False) is None
    assert bundles.register(HOPPER, [], strict=False) is None  # a second look says nothing new
    err = capsys.readouterr().err
    assert err.count("notice: bundle") == 1, err
    assert f"{other} was built with Triton 3.5.0" in err and "not used" in err
    assert binaries.source() is None
    with pytest.raises(ProvenanceMismatch, match="NBXCERT_STRICT_PROVENANCE=1 refuses it"):
        bundles.register(HOPPER, [], strict=True)


def test_a_bundle_for_another_target_is_ignored_with_its_notice(built, tmp_path, no_bundle_path, capsys, monkeypatch):
    ampere = get_profile("ampere")
    monkeypatch.setenv(bundles.ENV_PATH, str(tmp_path))
    (tmp_path / "hopper.nbxbundle").write_bytes(built.read_bytes())
    assert bundles.register(ampere, [], strict=False) is None
    err = capsys.readouterr().err
    assert "compiled for cuda sm_90 (warp 32), and nvidia/ampere runs cuda sm_80" in err
    sm80 = _variant(
        built, tmp_path / "other" / "sm80.nbxbundle", target={"arch": 80, "backend": "cuda", "warp_size": 32}
    )
    monkeypatch.setenv(bundles.ENV_PATH, str(sm80))
    assert bundles.register(HOPPER, [], strict=False) is None
    assert "compiled for cuda sm_80" in capsys.readouterr().err


def test_a_corrupt_bundle_is_not_used_and_strict_mode_refuses_it(built, tmp_path, no_bundle_path, capsys, monkeypatch):
    bad = tmp_path / "bad.nbxbundle"
    bad.write_bytes(built.read_bytes()[:-1])
    good = tmp_path / "good.nbxbundle"
    good.write_bytes(built.read_bytes())
    monkeypatch.setenv(bundles.ENV_PATH, os.pathsep.join([str(bad), str(good)]))
    source = bundles.register(HOPPER, [], strict=False)
    assert source is not None and [b.path for b in source.bundles] == [good]
    assert f"bundle {bad}: fails its SHA-256 trailer" in capsys.readouterr().err
    with pytest.raises(BundleCorrupt, match=f"bundle {bad}"):
        bundles.register(HOPPER, [], strict=True)


def test_serving_on_the_interpreter_opens_no_bundle(tmp_path, no_bundle_path, capsys, monkeypatch):
    from nbxcert import serving
    from nbxcert.kernels.backends import binaries

    junk = tmp_path / "junk.nbxbundle"
    junk.write_bytes(b"not a bundle")
    monkeypatch.setenv(bundles.ENV_PATH, str(junk))
    serving.reset()
    try:
        assert serving.state().bundles is None and binaries.source() is None
        assert "junk" not in capsys.readouterr().err
    finally:
        serving.reset()


def test_serving_state_on_a_gpu_profile_registers_its_bundles(built, tmp_path, no_bundle_path, monkeypatch):
    from nbxcert import serving
    from nbxcert.kernels.backends import binaries
    from nbxcert.serving import lookup

    certdir = tmp_path / "certs"
    (certdir / "nvidia" / "hopper").mkdir(parents=True)
    (certdir / "nvidia" / "hopper" / "shipped.nbxbundle").write_bytes(built.read_bytes())
    monkeypatch.setattr(lookup, "profile_in_force", lambda: (HOPPER, "141GB"))
    monkeypatch.setenv("NBXCERT_CACHE_DIR", str(tmp_path / "cache"))
    serving.configure(dirs=[certdir])
    try:
        st = serving.state()
        assert st.bundles is not None and binaries.source() is st.bundles
        assert st.bundles(*_a_launch(built)) is not None
        serving.reset()
        assert binaries.source() is None
    finally:
        serving.configure()
        serving.reset()


# --- the CI gate ------------------------------------------------------------------------------------------------------
def test_the_check_names_each_key_whose_certificate_changed_went_or_is_not_bundled(built, certdir, tmp_path, certs):
    import shutil

    from nbxcert.cli import app

    changed = tmp_path / "changed"
    shutil.copytree(certdir, changed)
    runner = CliRunner()
    ok = runner.invoke(app, ["bundle", "--check", str(built), "--dir", str(certdir)])
    assert ok.exit_code == 0, ok.output
    assert "matches its certificates" in ok.output
    entries = _entries(changed, "rmsnorm")
    entries[RMSNORM[0]]["seed"] += 1  # a re-certification: same winner, another entry
    del entries[RMSNORM[1]]
    more = "rmsnorm[n_cols=4096,n_rows=128;float16,float16]@v1"  # certified since the bundle was built
    entries[more] = json.loads((SHIPPED / "rmsnorm.float16.json").read_text())["entries"][more]
    certs.write_file(changed, entries, kernel="rmsnorm", dtype="float16")
    report = bundling.check(built, [changed])
    assert (report.changed, report.gone, report.missing) == ([RMSNORM[0]], [RMSNORM[1]], [more])
    failed = runner.invoke(app, ["bundle", "--check", str(built), "--dir", str(changed)])
    assert failed.exit_code == 1, failed.output
    assert f"changed: {RMSNORM[0]} (its certificate entry is not the one bundled)" in failed.output
    assert f"gone: {RMSNORM[1]}" in failed.output and f"missing: {more}" in failed.output
    assert "Traceback" not in failed.output


def test_an_entry_of_another_memory_class_beside_a_bundled_one_changes_nothing(built, certdir, tmp_path, certs):
    """A key's bundle is its first memory class's winner: an H100's entry added beside an H200's (`other_classes`)
    leaves the bundle matching its certificates."""
    import shutil

    beside = tmp_path / "beside"
    shutil.copytree(certdir, beside)
    entries = _entries(beside, "rmsnorm")
    first = own(entries[RMSNORM[0]])  # the shipped entry may hold another class's already: this one replaces it
    other = dict(first, memory_class="80GB" if first["memory_class"] != "80GB" else "141GB", seed=first["seed"] + 1)
    entries[RMSNORM[0]] = dict(first, other_classes={other["memory_class"]: other})
    certs.write_file(beside, entries, kernel="rmsnorm", dtype="float16")
    report = bundling.check(built, [beside])
    assert (report.changed, report.gone, report.missing) == ([], [], [])


def test_a_bundle_of_another_memory_class_holds_that_class_s_winners(built, certdir, tmp_path):
    """An H100 (80GB class) is served its own class's winner, which may be another config than the H200's: a bundle
    built with `--memory-class 80GB` holds those winners' binaries, is checked against that class's entries (the class
    its file name names, without the option), and is told changed against another class's, the rebuild command naming
    the class. A class the profile's cards do not have is refused by name."""
    from nbxcert.certificates import of_class
    from nbxcert.cli import app

    key = RMSNORM[0]
    held = _entries(certdir, "rmsnorm")[key]
    first, other = (
        of_class(held, held["memory_class"]),
        of_class(held, "80GB" if held["memory_class"] != "80GB" else "141GB"),
    )
    assert other is not None and other["winner"]["config"] != first["winner"]["config"], "the shipped key changed"
    cls = other["memory_class"]
    out = tmp_path / f"rmsnorm.{cls}.nbxbundle"
    runner = CliRunner()
    made = runner.invoke(
        app,
        [
            "bundle",
            "--profile",
            "hopper",
            "--key",
            key,
            "--dir",
            str(certdir),
            "--out",
            str(out),
            "--jobs",
            "1",
            "--memory-class",
            cls,
        ],
    )
    assert made.exit_code == 0, made.output
    with Bundle.open(out) as b, Bundle.open(built) as default:
        (bundled,) = b.keys
        assert bundled["config"] == other["winner"]["config"] and bundled["entry_digest"] == entry_digest(other)
        theirs = {x["binary"] for k in default.keys if k["key"] == key for x in k["launches"]}
        assert {x["binary"] for x in bundled["launches"]} != theirs  # another config: another cubin
    ok = runner.invoke(
        app,
        [
            "bundle",
            "--check",
            str(out),
            "--dir",
            str(certdir),
            "--key",
            key,
            "--profile",
            "hopper",
            "--memory-class",
            cls,
        ],
    )
    assert ok.exit_code == 0 and "matches its certificates" in ok.output, ok.output
    # without --memory-class: the class its file name names, as serving reads it; a class-less name, the first class's
    named = bundling.check(out, [certdir], [parse_key(key)])
    assert (named.memory_class, named.changed) == (cls, [])
    plain = tmp_path / "rmsnorm.nbxbundle"
    plain.write_bytes(out.read_bytes())
    assert bundling.check(plain, [certdir], [parse_key(key)]).changed == [key]
    relabelled = tmp_path / f"rmsnorm.{held['memory_class']}.nbxbundle"  # named for the other class: told changed
    relabelled.write_bytes(out.read_bytes())
    told = runner.invoke(
        app, ["bundle", "--check", str(relabelled), "--dir", str(certdir), "--key", key, "--profile", "hopper"]
    )
    assert told.exit_code == 1 and f"changed: {key}" in told.output, told.output
    assert f"--memory-class {held['memory_class']} ... --out {relabelled}" in told.output
    bad = runner.invoke(app, ["bundle", "--check", str(out), "--dir", str(certdir), "--memory-class", "7GB"])
    assert bad.exit_code != 0 and "--memory-class 7GB is not a class of nvidia/hopper's cards" in bad.output, bad.output
    assert "Traceback" not in bad.output


def test_the_check_names_each_key_whose_kernel_code_changed_since_the_build(built, certdir, tmp_path):
    """A kernel whose code changed since the bundle was built has another source key: serving would find none of its
    binaries, so the check fails naming the key and the kernel (here the bundle's record of it is changed instead)."""
    data = built.read_bytes()
    manifest, _ = _manifest_of(data)
    launch = manifest["keys"][0]["launches"][0]
    launch["source_key"] = "0" * 64
    forged = tmp_path / "stale.nbxbundle"
    forged.write_bytes(_with_manifest(data, canonical(manifest)))
    report = bundling.check(forged, [certdir])
    assert report.stale == [f"{manifest['keys'][0]['key']}: {launch['identity']}"]
    assert not report.ok and not report.sources_unchecked
    assert bundling.check(built, [certdir]).stale == []


def test_the_check_reads_the_source_keys_of_kernels_no_spec_lists():
    """A launch may use a JIT function its spec's `kernels` does not list (pointwise's tiled kernel for a transposed
    operand): the check reads every JIT function the kernel modules define, or a bundle holding such a launch is
    called stale though nothing changed."""
    from crosstools import target

    keys = bundling.source_keys(target(90))
    assert "nbxcert.kernels.pointwise._tile_kernel" in keys
    assert "nbxcert.kernels.pointwise._map_kernel" in keys


def test_a_bundle_of_another_triton_is_checked_without_its_sources(built, certdir, tmp_path):
    data = built.read_bytes()
    manifest, _ = _manifest_of(data)
    manifest["triton_version"] = "0.0.1"
    other = tmp_path / "other.nbxbundle"
    other.write_bytes(_with_manifest(data, canonical(manifest)))
    report = bundling.check(other, [certdir])
    assert report.ok and report.sources_unchecked.startswith("built with Triton 0.0.1, this is Triton ")
    assert any("was not compared" in line for line in report.lines())


# --- kill and resume --------------------------------------------------------------------------------------------------
_KILLED_BUILD = r"""
import os, sys, time
real = os.fsync
def held(fd):  # the bundle's bytes are in its temporary file: say so, and wait to be killed
    print("writing", flush=True)
    time.sleep(600)
    real(fd)
os.fsync = held
from nbxcert.cli import main
sys.argv = ["nbxcert", "bundle", *sys.argv[1:]]
main()
"""


def test_a_build_killed_while_writing_leaves_the_previous_file_and_a_rerun_completes(built, certdir, tmp_path):
    out = tmp_path / "hopper.nbxbundle"
    previous = built.read_bytes()
    out.write_bytes(previous)
    args = ["--profile", "hopper", "--key", RMSNORM[1], "--dir", str(certdir), "--out", str(out), "--jobs", "1"]
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "NBXCERT_BACKEND")}
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_BUILD, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        line = proc.stdout.readline()
        assert line.strip() == "writing", line + proc.stderr.read()
        assert list(tmp_path.glob(".hopper.nbxbundle.*.tmp"))  # it had started writing
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
        proc.stderr.close()
    assert out.read_bytes() == previous  # the previous complete file, never a part of the new one
    rerun = subprocess.run(
        [sys.executable, "-m", "nbxcert", "bundle", *args], capture_output=True, text=True, env=env, timeout=600
    )
    check(rerun, 0, must=["[nbxcert] bundle nvidia/hopper (cuda sm_90, Triton ", "): 1 keys, "])
    with Bundle.open(out) as bundle:
        assert [k["key"] for k in bundle.keys] == [RMSNORM[1]]
        bundle.verify()
    assert not list(tmp_path.glob(".hopper.nbxbundle.*.tmp"))  # what the killed build left is gone
