"""Fixtures of the engine's reliability tests: the faulty kernels and the certificate builders of tests/fixtures."""

from __future__ import annotations

import sys

import pytest
from reliabilitytools import FIXTURES


@pytest.fixture(scope="module")
def faulty(backend):
    if backend.name != "interpreter":
        pytest.skip("the interpreter equivalents of the faults; the GPU run is test_on_the_gpu_...")
    sys.path.insert(0, str(FIXTURES))  # spawned workers inherit sys.path
    import faulty_kernels

    return faulty_kernels


@pytest.fixture(scope="module")
def certs():
    sys.path.insert(0, str(FIXTURES))
    import certs as module

    return module
