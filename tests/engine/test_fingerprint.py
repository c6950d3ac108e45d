"""The code digest a certification records (`nbxcert.fingerprint`): what it covers, and how `certify` skips by it."""

from __future__ import annotations

import json

import pytest

from nbxcert import certify, fingerprint
from nbxcert.kernels.spec import load_all
from nbxcert.keys import parse_key
from nbxcert.profiles import get_profile


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(fingerprint, "_memo", {})


def test_same_card_compares_the_code_digest_when_both_hold_one_else_the_version():
    card = {
        "gpu": "g",
        "gpu_memory_bytes": 1,
        "compute_capability": "9.0",
        "driver": "1",
        "triton": "3.6.0",
        "backend": "cuda",
        "nbxcert": "0.4.0",
    }
    assert certify.same_card(dict(card, code="a"), dict(card, code="a", nbxcert="0.5.0"))
    assert not certify.same_card(dict(card, code="a"), dict(card, code="b"))
    assert certify.same_card(card, dict(card, code="a"))  # an entry made before the digest: by version
    assert not certify.same_card(dict(card, nbxcert="0.3.0"), dict(card, code="a"))
    assert not certify.same_card(dict(card, code="a"), dict(card, code="a", driver="2"))


def _digests_after_edits(monkeypatch, tmp_path, specs, profile, names, changes):
    """{changed module: {spec name: its digest}} with each module of `changes` edited in turn (as if its source had
    changed: a line of code added to a copy)."""
    real = fingerprint._module_file
    changed = [""]

    def edited(name: str):
        if name != changed[0]:
            return real(name)
        copy = tmp_path / f"{name}.py"
        copy.write_bytes(real(name).read_bytes() + b"\nCHANGED = 1\n")
        return copy

    monkeypatch.setattr(fingerprint, "_module_file", edited)
    out = {}
    for module in changes:
        changed[0] = module
        fingerprint._memo.clear()
        out[module] = {n: fingerprint.code_digest(specs[n], profile) for n in names}
    return out


def test_the_digest_covers_the_family_its_helpers_the_engine_and_the_device_file(fresh, monkeypatch, tmp_path):
    specs, hopper = load_all(), get_profile("hopper")
    digest = {n: fingerprint.code_digest(specs[n], hopper) for n in ("rmsnorm", "softmax", "embedding", "matmul")}
    assert digest["rmsnorm"] == digest["softmax"]  # one module, one oracle module
    assert len({digest["rmsnorm"], digest["embedding"], digest["matmul"]}) == 3
    assert fingerprint.code_digest(specs["rmsnorm"], get_profile("ampere")) != digest["rmsnorm"]  # the device file

    cases = (
        ("nbxcert.kernels.elementwise", {"embedding"}, {"rmsnorm", "softmax", "matmul"}),
        # the helpers the families share (matmul's tile order among them), not rows' own code
        ("nbxcert.kernels.common", {"rmsnorm", "softmax", "embedding", "matmul"}, set()),
        ("nbxcert.kernels.rows", {"rmsnorm", "softmax"}, {"embedding", "matmul"}),
        ("nbxcert.oracles.matmul", {"matmul"}, {"rmsnorm", "softmax", "embedding"}),
        ("nbxcert.runner", {"rmsnorm", "softmax", "embedding", "matmul"}, set()),  # the engine
        # the oracles' float64 products, imported inside matmul's oracle adapter (no global shows them)
        ("nbxcert.kernels.products", {"rmsnorm", "softmax", "embedding", "matmul"}, set()),
        # the worker processes' plumbing, the compile pools and certify's scheduling decide no verdict
        ("nbxcert.worker", set(), {"rmsnorm", "softmax", "embedding", "matmul"}),
        ("nbxcert.crosspool", set(), {"rmsnorm", "softmax", "embedding", "matmul"}),
        ("nbxcert.certify", set(), {"rmsnorm", "softmax", "embedding", "matmul"}),
    )
    after = _digests_after_edits(monkeypatch, tmp_path, specs, hopper, list(digest), [c[0] for c in cases])
    for changed, moved, kept in cases:
        now = after[changed]
        assert {n for n in digest if now[n] != digest[n]} == moved, changed
        assert {n for n in digest if now[n] == digest[n]} == kept, changed


def test_every_spec_is_digested_with_its_oracles_even_those_imported_only_when_judged(fresh, monkeypatch, tmp_path):
    """Every registered spec's digest covers an oracle module. The pointwise kernels import their oracle module and
    type promotion only when they run (no global shows them): they name them in `__digest_modules__`; an edit of
    either sweeps the pointwise keys again, and leaves the other families' digests. (Before, an oracle of the
    pointwise ops could change and every pointwise certificate count as made by the current code.)"""
    specs, hopper = load_all(), get_profile("hopper")
    own = {n: s for n, s in specs.items() if s.launch.__module__.startswith("nbxcert.kernels.")}  # not a test's spec
    assert len(own) > 100
    for name, spec in own.items():
        modules = fingerprint._reachable(spec.launch.__module__) | fingerprint._reachable(spec.oracle.__module__)
        assert any(m.startswith("nbxcert.oracles.") for m in modules), name
    digest = {n: fingerprint.code_digest(specs[n], hopper) for n in ("pw_neg", "pw_add", "rmsnorm", "matmul")}
    changes = ("nbxcert.oracles.pointwise", "nbxcert.kernels.promotion")
    for changed, now in _digests_after_edits(monkeypatch, tmp_path, specs, hopper, list(digest), changes).items():
        assert {n for n in digest if now[n] != digest[n]} == {"pw_neg", "pw_add"}, changed


def test_a_digest_module_declared_outside_nbxcert_kernels_and_oracles_is_refused(monkeypatch):
    import sys
    import types

    module = types.ModuleType("nbxcert.kernels.declares")
    module.__digest_modules__ = ("numpy",)
    monkeypatch.setitem(sys.modules, "nbxcert.kernels.declares", module)
    with pytest.raises(RuntimeError, match="names numpy, which is outside"):
        fingerprint._reachable("nbxcert.kernels.declares")


def test_an_edit_of_comments_or_docstrings_alone_keeps_the_digest(fresh, monkeypatch, tmp_path):
    """Prose is not code: a comment, a docstring, a blank line or trailing spaces edited in a family's module keep its
    digest (no key swept again for them); a string in code, or a comment marker inside one, is code."""
    specs, hopper = load_all(), get_profile("hopper")
    before = fingerprint.code_digest(specs["embedding"], hopper)
    real = fingerprint._module_file
    source = real("nbxcert.kernels.elementwise").read_text()
    tree_doc = source.split('"""', 2)[1]  # the module's docstring
    edits = {
        "docstring": source.replace(tree_doc, tree_doc + " Reworded.", 1),
        "comment": source.replace("\n", "\n# a new comment line\n", 1) + "   \n\n",
        "code": source + "\nNOTE = '# looks like a comment'\n",
    }
    digests = {}
    for what, text in edits.items():
        copy = tmp_path / f"{what}.py"
        copy.write_text(text)
        monkeypatch.setattr(
            fingerprint, "_module_file", lambda n, c=copy: c if n == "nbxcert.kernels.elementwise" else real(n)
        )
        fingerprint._memo.clear()
        digests[what] = fingerprint.code_digest(specs["embedding"], hopper)
    assert digests["docstring"] == before and digests["comment"] == before
    assert digests["code"] != before
    doc = b'def f():\n    """Doc."""  # why\n    return "#1"  # done\n\n\n'
    assert fingerprint.code_text(doc) == b'def f():\n    return "#1"'
    # lines counted as Python counts them: a form feed (a page break) inside a docstring ends no line
    paged = b'import os\r\n\x0c\ndef f():\n    """one\x0cpage"""\n    return 1  # c\n'
    assert fingerprint.code_text(paged) == b"import os\ndef f():\n    return 1"


def test_certify_skips_a_key_of_unchanged_code_across_versions_and_sweeps_it_when_its_code_changed(
    fresh, monkeypatch, tmp_path, backend
):
    if backend.name != "interpreter":
        pytest.skip("a conformance run on the interpreter")
    key = parse_key("rmsnorm[n_cols=64,n_rows=2;float16,float16]@v1")
    out = tmp_path / "certs"
    first = certify.certify("interpreter", [key], out, jobs=1)
    assert [k.status for k in first.keys] == ["certified"]
    entry = json.loads((out / "cpu/interpreter/rmsnorm.float16.json").read_text())["entries"][key.text()]
    assert entry["provenance"]["code"] == fingerprint.code_digest(load_all()["rmsnorm"], get_profile("interpreter"))
    monkeypatch.setattr(certify, "provenance", lambda real=certify.provenance: dict(real(), nbxcert="9.9.9"))
    again = certify.certify("interpreter", [key], out, jobs=1)  # another version, the same code: skipped
    assert [k.status for k in again.keys] == ["skipped"]
    assert again.keys[0].reason == "already certified for this card, versions and code"
    monkeypatch.setattr(certify, "code_digest", lambda spec, profile: "0000000000000000")
    changed = certify.certify("interpreter", [key], out, jobs=1)  # the code changed: swept again
    assert [k.status for k in changed.keys] == ["certified"]


def test_the_digest_does_not_depend_on_what_was_imported_before(monkeypatch, tmp_path):
    """A package's submodules appear among its globals once imported (`nbxcert.kernels.backends.cuda` after a lazy
    import): the digest must not follow them, or two runs of one command could disagree."""
    import importlib
    import sys

    (tmp_path / "fppkg").mkdir()
    (tmp_path / "fppkg" / "__init__.py").write_text("X = 1\n")
    (tmp_path / "fppkg" / "lazy.py").write_text("Y = 2\n")
    (tmp_path / "fppkg" / "home.py").write_text("import fppkg\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(fingerprint, "FOLLOWED", ("fppkg",))
    for name in ("fppkg", "fppkg.home", "fppkg.lazy"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    importlib.import_module("fppkg.home")
    before = fingerprint._reachable("fppkg.home")
    assert before == {"fppkg.home", "fppkg"}
    importlib.import_module("fppkg.lazy")  # as a lazy import somewhere would
    assert hasattr(sys.modules["fppkg"], "lazy")
    assert fingerprint._reachable("fppkg.home") == before
