"""A certificate keeps every fully timed candidate (`finalists`, fastest first): the choice of its winner can be
audited and a change of the winner rule applied without sweeping the key again. Serving's index leaves them out."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import stale_winners as sw  # noqa: E402

from nbxcert import certificates  # noqa: E402
from nbxcert.errors import CertificateInvalid  # noqa: E402

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


def test_stale_winners_applies_todays_rule_to_the_finalists(backend):
    """With finalists the rule itself runs over all of them, the kernel's untuned default preferred inside the band."""
    from nbxcert.kernels import rows

    def side(config, median, spread, reps):
        timing = {"median_us": median, "min_us": median, "spread": spread, "reps": reps, "kind": "cuda_events"}
        return {"config": config.as_dict(), "timing": timing}

    default = rows.RMSNORM.default
    other = next(c for c in rows.RMSNORM.candidates if c != default)
    slow_default, fast = side(default, 20.0, 1.0, 50), side(other, 10.0, 2.5, 500)  # old band: 350% wide
    entry = {"winner": slow_default, "runner_up": fast, "finalists": [fast, slow_default]}
    assert sw.stale(entry, "rmsnorm") == pytest.approx(2.0)
    assert sw.stale(entry) == pytest.approx(2.0), "without the kernel, the runner-up says the same"
    near = side(default, 10.2, 0.2, 50)  # within today's band too: the default stays
    assert sw.stale({"winner": near, "runner_up": fast, "finalists": [fast, near]}, "rmsnorm") is None
