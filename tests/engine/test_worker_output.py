"""Workers on a busy machine: a worker keeps what a request prints off the user's terminal (Triton prints a kernel's
whole PTX when ptxas crashes) and shows it with the failure's traceback under NBXCERT_DEBUG=1; a compile worker short of
device memory waits for its siblings' to come back; out of memory is a refusal by resources, not a crash."""

from __future__ import annotations

import os
import sys

import pytest

from nbxcert import worker
from nbxcert.errors import CudaError, DeviceOutOfMemory


def test_output_written_to_the_stdout_descriptor_is_captured_not_shown(capfd):
    with worker.captured_output() as text:
        print("from print", file=sys.__stdout__)  # the worker's sys.stdout (pytest replaces this one)
        os.write(1, b"from C code\n")
    assert text == ["from print\nfrom C code\n"]
    assert capfd.readouterr().out == ""
    print("after")
    assert capfd.readouterr().out == "after\n", "stdout is restored"


def test_output_is_captured_when_the_request_raises(capfd):
    text: list[str] = []
    try:
        with worker.captured_output() as text:
            os.write(1, b"=====\nptxas failed\n")
            raise RuntimeError("PTXASError")
    except RuntimeError:
        pass
    assert text == ["=====\nptxas failed\n"]
    assert capfd.readouterr().out == ""


def test_a_failed_reply_is_traced_only_under_debug(capfd, monkeypatch):
    message = {"op": "compile", "spec": "matmul", "config": {"BLOCK_M": 64}}
    reply = {"status": "compile", "reason": "PTXASError: ptxas failed", "traceback": "Traceback ...\nits output"}
    monkeypatch.delenv("NBXCERT_DEBUG", raising=False)
    worker._debug_trace(message, reply)
    assert capfd.readouterr().err == ""
    monkeypatch.setenv("NBXCERT_DEBUG", "1")
    worker._debug_trace(message, reply)
    err = capfd.readouterr().err
    assert err.startswith("[nbxcert] worker: compile matmul {'BLOCK_M': 64} failed:") and "its output" in err


def _cuda_error(status: int):
    e = CudaError(f"cuMemAlloc_v2 (1879048192 bytes on device 0) failed: status {status}")
    e.status = status
    return e


def test_out_of_device_memory_is_a_refusal_by_resources_other_driver_errors_a_crash():
    assert worker._classify(_cuda_error(2)) == "resources"
    assert worker._classify(_cuda_error(700)) == "crash"  # an illegal address
    # nbxcert's pool gave back what it kept and tried again: the candidate does not fit the device now, and the
    # worker's context stays usable (a crash once, it cost the H200's prefill keys a worker each)
    assert worker._classify(DeviceOutOfMemory("out of memory on cuda:0: asked for 9941811200 bytes")) == "resources"


def _compile_inputs_with(monkeypatch, make):
    """runner._compile_inputs with `make` in place of making shape-only inputs; (result or the error, waits)."""
    from nbxcert import runner

    slept: list[float] = []
    monkeypatch.setattr(runner.time, "sleep", slept.append)
    monkeypatch.setattr(runner, "_shape_only_inputs", make)
    try:
        return runner._compile_inputs("spec", {}, (), 0, "cuda:0"), slept
    except CudaError as e:
        return e, slept


def test_a_compile_worker_waits_out_its_siblings_memory(monkeypatch):
    from nbxcert import runner

    calls = []

    def short_twice(*args):
        calls.append(args)
        if len(calls) <= 2:
            raise _cuda_error(2)
        return "inputs"

    got, slept = _compile_inputs_with(monkeypatch, short_twice)
    assert got == "inputs" and len(calls) == 3 and slept == [runner.OOM_WAIT_S, 2 * runner.OOM_WAIT_S]


@pytest.mark.parametrize("status, waits", [(2, 5), (700, 0)])
def test_a_lasting_shortage_is_raised_after_the_waits_another_driver_error_at_once(monkeypatch, status, waits):
    from nbxcert import runner

    def failing(*args):
        raise _cuda_error(status)

    got, slept = _compile_inputs_with(monkeypatch, failing)
    assert isinstance(got, CudaError) and got.status == status  # the driver's own error comes out
    assert len(slept) == (runner.OOM_RETRIES if waits else 0)
