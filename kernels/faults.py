"""Faults a kernel finds on the device: an index read at run time that lies outside what it indexes.

The kernels that index with run-time integers (embedding's ids, rope's positions, decode attention's lengths and a
paged cache's block ids) check each one where they read it: a bad one is not read through (its loads are masked; what
the kernel then writes is in SITES) and is recorded in its device's fault word, int64 [site, index, value, bound].
On a GPU the word is pinned host memory mapped into the device, so the host reads it with no copy and no wait, and it
does so after every synchronising driver call nbxcert makes (every copy to or from the device, `cuda.synchronize`, an
event's or a stream's wait): a recorded fault raises `LaunchError` there, naming the kernel, the value, its index and
the bound, and the word is cleared. No value can be read back through nbxcert without passing such a point, so
nothing computed from a bad index reaches the host unreported, and the launch itself never waits for the device (the
host check these kernels made before was a copy of the indices to the host before each launch: a device wait per
launch). Code that reads device memory by other means (another library, DLPack) should call `cuda.synchronize()`
first, which raises what was recorded. Under the interpreter the word is read after each launch.

When several indices of one launch are bad, the one reported is one of them, not necessarily the first. A checking
kernel's programs write their records with plain stores, in no set order, so with bad indices found by different
programs (different tokens or sequences, or in paged decode attention a bad length and a bad block id) the words
reported may mix two records: the launch is refused all the same, but its line may pair one bad index's value with
another's position (a vector record, `record_fault_lanes`, packs its pair in one word, which cannot mix). A record
claimed whole by one program needs an atomic on the mapped host memory, which a PCIe host does not promise."""

from __future__ import annotations

import threading

import numpy as np

from nbxcert.errors import LaunchError
from nbxcert.kernels import recording as _recording
from nbxcert.kernels.jit import jit, settle_keys, tl
from nbxcert.kernels.tensor import Device, Storage, Tensor, as_device, from_numpy

# site -> (kernel, what the value is, what it indexes given the bound, what the kernel did with it)
SITES = {
    1: ("embedding", "id", "the table of {bound} rows", "that row of its output is zeros"),
    2: ("rope", "position", "the cos/sin cache of {bound} rows", "that token of q and k is left unrotated"),
    3: (
        "decode attention",
        "length",
        "[0, {bound}] (the cache's capacity, the block table's reach or max_len)",
        "that sequence attends to nothing: its output is zeros",
    ),
    4: (
        "paged decode attention",
        "block id",
        "the pool of {bound} blocks (index: the block table entry, in elements from its start)",
        "those positions are skipped",
    ),
    5: (
        "integer division or remainder (pointwise)",
        "divisor",
        "the nonzero integers (torch raises ZeroDivisionError)",
        "the output is undefined",
    ),
    6: (
        "float to integer cast (pointwise)",
        "value class (1: NaN, 2: +inf or above the range, 3: -inf or below it)",
        "the range of the {bound}-bit integer type",
        "the output is undefined",
    ),
}
EMBEDDING_ID, ROPE_POSITION, DECODE_LENGTH, BLOCK_ID, INTEGER_DIVISOR, FLOAT_TO_INT = 1, 2, 3, 4, 5, 6
# the value word of a record whose index word packs (index << 32) | (32-bit value): `record_fault_lanes`; an impossible
# value for a scalar record's (those hold the bad value itself, and no checked value is this large a negative)
PACKED_VALUE = -(2**62)
PACKED = tl.constexpr(PACKED_VALUE)
WORDS = 4  # site, index, value, bound

_lock = threading.Lock()
_words: dict[Device, tuple[object, Tensor]] = {}  # device -> (its words' owner, the int64 [4] tensor kernels get)


def word(device: str | Device) -> Tensor:
    """The fault word of `device`, an int64 [4] tensor to pass to a checking kernel."""
    device = as_device(device)
    found = _words.get(device)
    if found is not None:
        return found[1]
    with _lock, _recording.paused():  # the device's one word, not memory of the call that asked first
        if device not in _words:
            if device.type == "cpu":
                tensor = from_numpy(np.zeros(WORDS, np.int64), "int64", device)
                _words[device] = (tensor, tensor)
            else:
                from nbxcert.kernels.backends import cuda

                words = cuda.MappedHostWords(WORDS, device.index)
                storage = Storage.over(words, 8 * WORDS, device)
                _words[device] = (words, Tensor(storage, (WORDS,), (1,), "int64"))
                cuda.add_sync_hook(raise_recorded)
    return _words[device][1]


def _host_view(owner) -> np.ndarray:
    """The words as the host reads and writes them in place: the mapped memory's view, or the cpu tensor's bytes."""
    return owner._storage._host.view(np.int64) if isinstance(owner, Tensor) else owner.host


def raise_recorded() -> None:
    """Raise `LaunchError` for a fault a kernel recorded (and clear it); nothing when none was."""
    for device, (owner, _tensor) in list(_words.items()):
        view = _host_view(owner)
        if view[0] == 0:
            continue
        site, index, value, bound = (int(v) for v in view)
        view[:] = 0
        if value == PACKED_VALUE:  # one lane's (index, value) from `record_fault_lanes`
            index, value = index >> 32, (index & 0xFFFFFFFF) - ((index & 0x80000000) << 1)
        unknown = (f"fault site {site}", "value", "its bound {bound}", "the launch's output is undefined")
        kernel, name, where, effect = SITES.get(site, unknown)
        later = "" if device.type == "cpu" else ", reported at the first synchronisation after the launch"
        raise LaunchError(
            f"{kernel}: {name} {value} at index {index} is outside {where.format(bound=bound)} (found by the kernel "
            f"on {device}{later}; {effect})"
        )


def after_launch(device: Device) -> None:
    """After a checking kernel's launch: under the interpreter (which runs the launch before returning) raise what it
    recorded now; on a GPU the next synchronisation does."""
    if device.type == "cpu":
        _recording.then(raise_recorded)  # a replay of the call checks at the same point
        raise_recorded()


@jit
def record_fault(fault_ptr, site: tl.constexpr, index, value, bound, bad):
    """Write [site, index, value, bound] (int64) at fault_ptr where `bad` (a scalar) holds; the site last, so a record
    whose site is set is whole once the launch has finished (`nbxcert.kernels.faults` reads it after a
    synchronisation)."""
    tl.store(fault_ptr + 1, index.to(tl.int64), mask=bad)
    tl.store(fault_ptr + 2, value.to(tl.int64), mask=bad)
    tl.store(fault_ptr + 3, tl.full((), bound, tl.int64), mask=bad)
    tl.store(fault_ptr, tl.full((), site, tl.int64), mask=bad)


@jit
def record_fault_lanes(fault_ptr, site: tl.constexpr, index, value, bound, bad):
    """`record_fault` for a vector of lanes (`bad` a mask over them), with no reduction across them: each bad lane
    stores its index and value packed in one 64-bit word, (index << 32) | (value & 0xFFFFFFFF) (index < 2^31, value
    a 32-bit integer), so the word read is one lane's pair whichever lane's store lands last."""
    at = tl.zeros_like(index).to(tl.int64)  # every lane addresses the same words
    packed = (index.to(tl.int64) << 32) | (value.to(tl.int64) & 0xFFFFFFFF)
    tl.store(fault_ptr + 1 + at, packed, mask=bad)
    tl.store(fault_ptr + 2 + at, at + PACKED, mask=bad)
    tl.store(fault_ptr + 3 + at, at + bound, mask=bad)
    tl.store(fault_ptr + at, at + site, mask=bad)


settle_keys(globals())  # every JIT function's key read as the import ends (see settle_keys)
