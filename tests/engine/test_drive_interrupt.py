"""`worker.drive_all` interrupted (Ctrl-C) while a thread is between a reply and its progress callback: the thread
leaves without a word. Bug seen in CI: after Ctrl-C, certify said its one line, then "Exception in thread ... (drive)"
with a traceback. Two ways there: the interrupt landing while the threads started (they were then neither stopped nor
joined), and a thread's progress callback failing on a display the interrupted caller was closing."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from nbxcert.worker import drive_all


class _InterruptingWorker:
    """Interrupts the main thread as it answers, then answers a little later (after the caller has stopped)."""

    def request(self, message, timeout_s):
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # Ctrl-C, as the terminal sends it
        time.sleep(0.5)
        return {"status": "done"}

    def kill(self) -> None:
        pass


def test_an_interrupted_drive_leaves_no_thread_traceback(monkeypatch):
    seen = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_value))

    def on_reply(count: int) -> None:
        raise RuntimeError("the progress display is closed")

    with pytest.raises(KeyboardInterrupt):
        drive_all([_InterruptingWorker()], [{"op": "check"}], 5.0, on_reply)
    assert seen == []


def test_a_progress_callback_that_fails_uninterrupted_is_not_hidden(monkeypatch):
    seen = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_value))

    class Quiet(_InterruptingWorker):
        def request(self, message, timeout_s):
            return {"status": "done"}

    def on_reply(count: int) -> None:
        raise RuntimeError("a bug in the callback")

    drive_all([Quiet()], [{"op": "check"}], 5.0, on_reply)
    assert [str(e) for e in seen] == ["a bug in the callback"]
