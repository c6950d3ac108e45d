"""What a served call did, as it does it: the record a launch plan is made from (`nbxcert.kernels.launch`).

While a served call runs for the first time with a given signature, this thread's `Recording` collects, in order,
the kernel launches it makes and the device memory it allocates (storages made during the call), and notes any work
that ties the call to its data: a copy between host and device, a host read of a tensor's values, a synchronisation.
A call that did such work is not replayable (its launches may depend on the values read), so it gets no plan.

This module is a leaf of the kernel layer (the tensor, the CUDA bindings and the launch module report to it), so the
record costs one thread-local read where nothing is recording. Work made on nbxcert's own behalf while a call runs
(a kernel's execution under the interpreter, a persistent buffer made on first use) is done `paused()`, so that it is
neither recorded nor counted against the call.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any


class _State(threading.local):
    rec: Recording | None = None  # this thread's recording, None when none is on (a class default: read with no call)


# public so that the served path (in Python and in C, launcher.c) reads it with no call
state = _State()


class Recording:
    """One served call's record: `launches` (KernelLaunch objects, in order), `storages` (the Storage objects made
    during the call, in order), `extras` (what else a replay must do, each with the number of launches made before
    it: ("zero", storage index) for a zero-fill on the stream, ("call", fn, args) for a host function such as the
    interpreter's fault check) and `host_work` (why the call is tied to its data, or None)."""

    __slots__ = ("launches", "storages", "extras", "host_work", "paused")

    def __init__(self) -> None:
        self.launches: list[Any] = []
        self.storages: list[Any] = []
        self.extras: list[tuple[int, tuple]] = []
        self.host_work: str | None = None
        self.paused = 0


def active() -> Recording | None:
    """This thread's recording, if one is on and not paused."""
    rec = getattr(state, "rec", None)
    return rec if rec is not None and not rec.paused else None


@contextlib.contextmanager
def recording() -> Iterator[Recording]:
    """Record the block on this thread (nested: the outer recording goes on collecting)."""
    outer = getattr(state, "rec", None)
    if outer is not None:
        yield outer
        return
    rec = state.rec = Recording()
    try:
        yield rec
    finally:
        state.rec = None


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Work done on nbxcert's own behalf inside a recorded call: not recorded, not counted."""
    rec = getattr(state, "rec", None)
    if rec is None:
        yield
        return
    rec.paused += 1
    try:
        yield
    finally:
        rec.paused -= 1


def storage_made(storage: Any) -> None:
    rec = active()
    if rec is not None:
        rec.storages.append(storage)


def zeroed(storage: Any) -> None:
    """A storage made in the call and zero-filled on the stream (`tensor.zeros`): a replay fills its own alike."""
    rec = active()
    if rec is not None:
        for i, s in enumerate(rec.storages):
            if s is storage:
                rec.extras.append((len(rec.launches), ("zero", i)))
                return
        rec.host_work = rec.host_work or "a zero-fill of memory the call did not make"


def then(fn, *args) -> None:
    """The call ran `fn(*args)` on the host after its launches so far (a check of what they recorded): a replay runs
    it at the same point."""
    rec = active()
    if rec is not None:
        rec.extras.append((len(rec.launches), ("call", fn, args)))


def host_work(what: str) -> None:
    """The call did `what` (a copy, a host read, a synchronisation): it is tied to its data, and gets no plan."""
    rec = active()
    if rec is not None and rec.host_work is None:
        rec.host_work = what
