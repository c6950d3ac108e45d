"""Workload files as a user writes them: a value YAML or Python would take for another (a key given twice, 1.0 or true
for a version, a range whose min is above its max) is refused in one line naming the file and the field, never read
as something else."""

from __future__ import annotations

import pytest

from nbxcert.errors import WorkloadInvalid
from nbxcert.workload import load_workload, parse_workload

SHIPPED = load_workload("llama-3-8b")


def text(old: str, new: str) -> str:
    from importlib import resources

    original = resources.files("nbxcert").joinpath("workloads", "llama-3-8b.yml").read_text(encoding="utf-8")
    assert original.count(old) == 1, old
    return original.replace(old, new)


def refusal(yml: str) -> str:
    with pytest.raises(WorkloadInvalid) as e:
        parse_workload(yml, "w.yml")
    line = str(e.value)
    assert "\n" not in line and line.startswith("w.yml: "), line
    return line


def test_the_shipped_file_as_written_parses():
    w = parse_workload(text("name: llama-3-8b", "name: llama-3-8b"), "w.yml")
    assert (w.model, w.dtypes, w.phases) == (SHIPPED.model, SHIPPED.dtypes, SHIPPED.phases)


def test_a_key_given_twice_is_refused_not_the_last_one_kept():
    line = refusal(text("  heads: 32\n", "  heads: 32\n  heads: 16\n"))
    assert "key 'heads' given twice (line 8)" in line, line


def test_a_merge_key_and_the_keys_after_it_are_yaml_not_a_duplicate():
    base = text("phases:\n", "defaults: &d {ladder: batch, max: 64}\nphases:\n")
    yml = base.replace("decode_batch: {ladder: batch, max: 64}", "decode_batch: {<<: *d, max: 32}")
    assert "field 'defaults': unknown field" in refusal(yml)  # parsed: refused for the unknown field, not the merge


@pytest.mark.parametrize("version", ["1.0", "true", "'1'"])
def test_a_schema_version_other_than_the_integer_1_is_refused(version):
    line = refusal(text("schema_version: 1", f"schema_version: {version}"))
    assert "field 'schema_version'" in line and "is not 1" in line, line


def test_a_ladder_range_whose_min_is_above_its_max_is_refused():
    line = refusal(text("min: 128, max: 8192", "min: 8192, max: 128"))
    assert "field 'phases.kv_lens.min': 8192 is above max 128" in line, line


def test_a_ladder_range_of_one_rung_still_parses():
    w = parse_workload(text("min: 128, max: 8192", "min: 128, max: 128"), "w.yml")
    assert w.phases["kv_lens"] == {"ladder": "kv_len", "min": 128, "max": 128}
