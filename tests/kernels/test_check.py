"""`check_configs`: the check the kernel families' GPU tests run at real shapes (every kept config against the oracle
made once, and the no-bit claims). Here under the interpreter, with the faulty fixture kernels, so it can fail."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from nbxcert.kernels.check import no_bit_group
from nbxcert.kernels.spec import Config
from nbxcert.profiles import get_profile
from nbxcert.warm import check_configs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))


@pytest.fixture(scope="module")
def probe(backend):
    if backend.name != "interpreter":
        pytest.skip("the faulty kernels' interpreter behaviour")
    import faulty_kernels

    return faulty_kernels.SPEC


def _configs(spec, *faults):
    return [c for c in spec.candidates if c["FAULT"] in faults]


def test_correct_configs_pass_and_a_wrong_one_is_reported(probe, backend):
    profile = get_profile("interpreter")
    assert check_configs(probe, {"n": 300}, ("float32",), profile, 1, backend.device, _configs(probe, 0, 1)) == []
    failures = check_configs(probe, {"n": 300}, ("float32",), profile, 1, backend.device, _configs(probe, 0, 2))
    assert len(failures) == 1 and "Mismatched elements: 300 / 300" in failures[0] and "FAULT=2" in failures[0]


def test_a_false_no_bit_claim_is_reported(probe, backend):
    # FAULT 0 and 1 compute the same values; claiming FAULT changes no bit is true for them, false once 2 joins
    lying = dataclasses.replace(probe, name="fault_probe_lying", no_bit_fields=("FAULT",))
    profile = get_profile("interpreter")
    assert check_configs(lying, {"n": 64}, ("float32",), profile, 1, backend.device, _configs(lying, 0, 1)) == []
    failures = check_configs(lying, {"n": 64}, ("float32",), profile, 1, backend.device, _configs(lying, 0, 2))
    assert any("differs in bits from" in f and "no-bit claim" in f for f in failures), failures


def test_no_bit_groups_drop_warps_and_stages_only_when_claimed(probe):
    a = Config.make(num_warps=4, num_stages=1, BLOCK=64, FAULT=0)
    b = Config.make(num_warps=8, num_stages=1, BLOCK=64, FAULT=0)
    assert no_bit_group(probe, a) != no_bit_group(probe, b)
    claimed = dataclasses.replace(probe, name="fault_probe_warps", no_bit_fields=("num_warps",))
    assert no_bit_group(claimed, a) == no_bit_group(claimed, b)
