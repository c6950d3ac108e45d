"""A certificate keeps every fully timed candidate (`finalists`, fastest first): the choice of its winner can be
audited and a change of the winner rule applied without sweeping the key again (`nbxcert stale`,
tests/engine/test_stale.py). Serving's index leaves them out."""

from __future__ import annotations

import copy
import json

import pytest

from nbxcert import certificates
from nbxcert.errors import CertificateInvalid

KEY = "rmsnorm[n_cols=64,n_rows=8;float16,float16]@v1"


@pytest.fixture(scope="module")
def certified(backend, tmp_path_factory):
    if backend.name != "interpreter":
        pytest.skip("certifies under the interpreter profile")
    from nbxcert.certify import certify
    from nbxcert.keys import parse_key

    out = tmp_path_factory.mktemp("certs")
    report = certify("interpreter", [parse_key(KEY)], out)
    assert report.ok, report.keys
    (path,) = certificates.iter_files(out, "cpu/interpreter")
    return out, path


def test_the_finalists_are_every_fully_timed_candidate_fastest_first(certified):
    _out, path = certified
    entry = certificates.load_file(path).entries[KEY]
    finalists = entry["finalists"]
    medians = [f["timing"]["median_us"] for f in finalists]
    assert medians == sorted(medians) and len(finalists) >= 2
    configs = [f["config"] for f in finalists]
    assert entry["winner"]["config"] in configs and entry["runner_up"]["config"] in configs
    assert len(finalists) <= entry["counts"]["correct"]


def test_a_malformed_finalist_is_refused_by_name(certified, tmp_path):
    _out, path = certified
    doc = json.loads(path.read_text())
    bad = copy.deepcopy(doc)
    bad["entries"][KEY]["finalists"][0]["timing"].pop("reps")
    target = tmp_path / path.name
    target.write_text(json.dumps(bad))
    with pytest.raises(CertificateInvalid, match=r"finalists\[0\]\.timing\.reps"):
        certificates.load_file(target)


def test_the_index_leaves_the_finalists_out(certified, tmp_path):
    from nbxcert.index import load_index

    out, _path = certified
    index = load_index([out], "cpu/interpreter", "cpu", cache_dir=tmp_path / "cache")
    served = index.get(KEY)
    assert served is not None and "finalists" not in served and served["winner"]


def test_the_winner_rule_chooses_a_fresh_certificates_winner_again_from_its_finalists(certified):
    from nbxcert.stale import rule_choice

    _out, path = certified
    assert rule_choice(certificates.load_file(path).entries[KEY]) is None
