"""Every error a user of nbxcert can meet, as typed exceptions.

This module is a leaf: it imports nothing of nbxcert, so every layer (the kernel library, the oracles' tests, the
engine, the CLI) can raise these without importing upward. The CLI keeps the one table that turns each of them into a
single line on stderr with the next step to take (`nbxcert.cli.ERROR_TABLE`).

Each exception's message says what failed and which file, key or value; `hint` says what to do next.
"""

from __future__ import annotations


class NbxcertError(Exception):
    """Base class: an error a user can meet. `str(e)` is one line; `e.hint` is the next step."""

    default_hint = ""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = self.default_hint if hint is None else hint

    def __str__(self) -> str:
        return self.message


# --- the tensor layer -------------------------------------------------------------------------------------------------
class DTypeError(NbxcertError):
    """An unknown dtype, or one the backend in force does not have."""

    default_hint = "run `nbxcert doctor` to see the dtypes this backend supports"


class ViewError(NbxcertError):
    """A view (reshape/transpose/slice) the tensor's strides cannot express, or an out-of-range index."""

    default_hint = "make the tensor contiguous first (`.contiguous()`) or choose another view"


class ShapeMismatch(NbxcertError):
    """Two tensors whose shapes (or dtypes) had to agree do not."""

    default_hint = "pass tensors of the shapes and dtypes the message names"


class DeviceNotFound(NbxcertError):
    """A tensor or a launch named a device that does not exist."""

    default_hint = "run `nbxcert doctor` to list the devices this machine has"


class DTypeNotSupported(NbxcertError):
    """An op given a dtype it does not take (a bitwise op on floats, a transcendental function on integers, `-` on
    bools, ...), or a type promotion torch does not define (float8 types). Names the op and the dtype."""

    default_hint = "cast the operand first (`nbxcert.ops.cast`) to a dtype the op takes, as the message lists"


class CastRefused(NbxcertError):
    """An op's result dtype cannot be cast to the in-place or `out=` tensor's dtype under torch's casting rule (a
    float result into an integer or bool tensor, an integer result into a bool tensor). Names the op and both dtypes."""

    default_hint = "give an output tensor of the result dtype (or a wider one of its kind), or cast the result"


class ArgumentNotSupported(NbxcertError):
    """A torch argument (or value of one) that nbxcert's kernel cannot honour: `dropout_p` other than 0, an
    `attn_mask`, a reduction dimension other than the one the kernel reduces, a reduction it lacks, a layout that only
    a copy would serve. Names the op and the argument; never ignored silently."""

    default_hint = "leave the argument at the value the message names, or compute that part with another op"


# --- backends ---------------------------------------------------------------------------------------------------------
class BackendUnavailable(NbxcertError):
    """The backend asked for (NBXCERT_BACKEND or a device string) cannot be used on this machine."""

    default_hint = "run `nbxcert doctor` for what this machine has; NBXCERT_BACKEND=interpreter runs on the CPU"


class CudaError(NbxcertError):
    """A CUDA driver call returned a status other than CUDA_SUCCESS. Names the call and the CUresult."""

    default_hint = "run `nbxcert doctor`; an illegal address poisons the process's CUDA context (start a new process)"


class DeviceOutOfMemory(CudaError):
    """A device allocation failed after nbxcert released the memory its pool kept and tried once more. Names the
    bytes asked for, the bytes nbxcert's tensors hold, its pool's reserve and the device's free memory."""

    default_hint = "free tensors no longer needed (or other libraries' caches), or use smaller shapes or batches"


class LaunchError(NbxcertError):
    """A kernel launch was refused before it reached the device (bad arguments, out-of-range ids)."""

    default_hint = "change the launch as the message says; NBXCERT_DEBUG=1 shows where it was made"


class GraphRefused(NbxcertError):
    """A CUDA graph could not be made of a callable: something it does cannot be captured (a read to the host, a
    synchronisation, an allocation outside the graph's pool, work on another stream: named with the served op and its
    caller), or its first replay differs from an eager run (naming the output and the element)."""

    default_hint = (
        "run the named op outside the graph, or give it what it reads from the device (decode attention: max_len=); "
        "NBXCERT_DEBUG=1 shows the traceback"
    )


# --- device files and profiles ----------------------------------------------------------------------------------------
class DeviceFileInvalid(NbxcertError):
    """A device file breaks its schema: unknown field, wrong type, a value with no source. Names file and field."""

    default_hint = "fix the device file; every value needs `value:` and `source:`"


class DeviceFactMissing(NbxcertError):
    """A fact was asked of a device file that does not state it. Names the file and the field."""

    default_hint = "add the fact, with its source, to the device file named"


class ProfileNotFound(NbxcertError):
    """No device file has this profile name."""

    default_hint = "run `nbxcert profiles` to list the shipped profiles"


class ProfileMismatch(NbxcertError):
    """The profile asked for is not the one the device in force matches."""

    default_hint = "run `nbxcert doctor` to see which profile this machine matches"


# --- kernels, keys, certification, serving ----------------------------------------------------------------------------
class KernelSpecInvalid(NbxcertError):
    """A KernelSpec that refuses itself on creation (empty candidates, a key argument not in the signature, ...)."""

    default_hint = "fix the kernel's declaration in the module that registers it (the one given to --spec)"


class KernelNotFound(NbxcertError):
    """No registered kernel has this name."""

    default_hint = "run `nbxcert kernels` to list the registered kernels (a kernel of your own: --spec MODULE)"


class PruneEmpty(NbxcertError):
    """The prune of a kernel left no candidate for a key on a device."""

    default_hint = "no candidate fits this device: certify the key for a larger device class, or add a candidate"


class OracleMismatch(NbxcertError):
    """A kernel's output disagrees with its float64 oracle beyond the tolerance. The message is the full report."""

    default_hint = "this config is wrong for this key: certify the key again (`nbxcert certify ... --force`)"


class KeyParseError(NbxcertError):
    """A launch key's text does not parse."""

    default_hint = "a key reads like `rmsnorm[n_cols=2048,n_rows=512;float16,float16]@v1`"


class KeyNotCertified(NbxcertError):
    """Certified-only mode met a launch key that no certificate covers."""

    default_hint = "certify it: `nbxcert certify --profile PROFILE --key 'KEY'`"


class ServerNotRegistered(NbxcertError):
    """A launch asked the kernel layer for a served config while no server is registered with it
    (`nbxcert.kernels.server.set_server`)."""

    default_hint = (
        "give the launch a config (`config=`), or register a server: `import nbxcert` registers serving's, "
        "`nbxcert.kernels.server.set_server(fn)` another"
    )


class WorkloadInvalid(NbxcertError):
    """A workload file with an unknown kind or a missing field. Names the file and the field."""

    default_hint = (
        "fix the workload file: the shipped ones show every field (`nbxcert/workloads/demo.yml`); or name a shipped "
        "workload (`--workload demo`)"
    )


class HfConfigInvalid(NbxcertError):
    """A Hugging Face model config (`--hf-config`) that does not map to a workload: not a JSON object, an unknown
    `model_type`, a field missing, of an unknown value, or one nbxcert has no launch for. Names file and field."""

    default_hint = (
        "write a workload file for this model instead (`nbxcert/workloads/llama-3-8b.yml` shows every field) and give "
        "it with --workload FILE"
    )


class CertificateInvalid(NbxcertError):
    """A certificate file that breaks its schema. Names file, key, field and reason."""

    default_hint = "run `nbxcert validate DIR` to list every problem"


class ProvenanceMismatch(NbxcertError):
    """A certification made with another Triton major version, another driver major or on a device of another
    profile, refused by serving under NBXCERT_STRICT_PROVENANCE=1. Names the key and what differs."""

    default_hint = (
        "re-certify it on this machine (`nbxcert certify ... --force`), or unset NBXCERT_STRICT_PROVENANCE to serve "
        "it with a notice; `nbxcert doctor` lists the certificates this machine rejects"
    )


class IndexCorrupt(NbxcertError):
    """A binary index whose magic, length or SHA-256 trailer does not hold. Names the file and the reason."""

    default_hint = "run `nbxcert index build DIR` (it is rebuilt from the JSON certificates)"


class BundleCorrupt(NbxcertError):
    """A bundle of compiled kernels (`nbxcert bundle`) whose magic, lengths, SHA-256 trailer, manifest or a binary's
    digest does not hold, or that is not a regular file. Names the file and what is wrong; nothing in it is used."""

    default_hint = (
        "rebuild it (`nbxcert bundle --profile P ... --out FILE`), or take it off the search path "
        "(NBXCERT_BUNDLE_PATH, <certificate dir>/<vendor>/<profile>/*.nbxbundle)"
    )


class UsageError(NbxcertError):
    """A command-line request that cannot be carried out as given."""
