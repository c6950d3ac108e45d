"""A worker keeps what a request prints off the user's terminal (Triton prints a kernel's whole PTX when ptxas
crashes), and shows it with the failure's traceback under NBXCERT_DEBUG=1."""

from __future__ import annotations

import os
import sys

from nbxcert import worker


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
