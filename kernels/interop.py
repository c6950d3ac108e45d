"""Foreign tensors at nbxcert's served entry points: torch, CuPy, JAX or numpy tensors in, the same kind out.

A served op given another library's tensors runs on nbxcert views of them (`to_nbx`: DLPack or the CUDA array
interface, no copy) and hands each nbxcert tensor of its result back as a tensor of the caller's library (`to_caller`:
that library's own `from_dlpack`, no copy). An argument the op returns as it is (an in-place op, an `out=`) comes back
as the very object the caller passed. nbxcert imports none of these libraries: a tensor's library is read from its
type, and found among the modules the caller has imported already.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from nbxcert.errors import DTypeError, UsageError
from nbxcert.kernels.backends import select
from nbxcert.kernels.tensor import Tensor, from_dlpack

_PLAIN = frozenset({int, float, bool, str, bytes, complex, type(None)})  # the common non-tensor arguments: no lookup


def is_foreign(value: Any) -> bool:
    """True for another library's tensor: not an nbxcert `Tensor`, but something with `__dlpack__` or
    `__cuda_array_interface__`. A numpy array counts only where kernels run on the cpu (the interpreter backend):
    on a GPU it is host data, left to the op. numpy scalars never count."""
    kind = type(value)
    if kind in _PLAIN or issubclass(kind, (Tensor, np.generic)):
        return False
    if issubclass(kind, np.ndarray):
        return select().device == "cpu"
    return hasattr(kind, "__dlpack__") or hasattr(kind, "__cuda_array_interface__")


def library_of(value: Any) -> str:
    """The library `value`'s type comes from: the top-level name of its module (`torch`, `cupy`, `numpy`; `jax` for
    jaxlib's arrays), which must be loaded already (`UsageError` otherwise: nbxcert imports nothing for it)."""
    module = type(value).__module__ or ""
    name = module.partition(".")[0]
    if name == "jaxlib":
        name = "jax"
    if name not in sys.modules:
        raise UsageError(
            f"a {type(value).__qualname__} comes from module '{module}', but no module '{name}' is loaded",
            hint="import the library that made the tensor, or pass nbxcert tensors",
        )
    return name


class Caller(str):
    """The library of a call's foreign tensors (`"torch"`, `"cupy"`, `"jax"`, `"numpy"`, ...), with the nbxcert view
    made of each of them: `originals` maps id(view) -> (view, the caller's object); `where` names the argument the
    first one came in."""

    def __new__(cls, library: str, where: str) -> Caller:
        self = super().__new__(cls, library)
        self.where = where
        self.originals: dict[int, tuple[Tensor, Any]] = {}
        return self


def to_nbx(args: tuple, kwargs: dict) -> tuple[tuple, dict, Caller | None]:
    """`args` and `kwargs` with every foreign tensor (also inside tuples and lists) replaced by an nbxcert view of it,
    and the `Caller` (None where there was none: then `args` and `kwargs` come back as they are). One object passed
    twice becomes one view. The foreign tensors of one call must come from one library (`UsageError` names both)."""
    state: list = [None, {}]  # the Caller, id(foreign object) -> its view
    new_args = tuple(_inward(value, f"argument {i}", state) for i, value in enumerate(args))
    new_kwargs = {key: _inward(value, f"argument '{key}'", state) for key, value in kwargs.items()}
    caller = state[0]
    if caller is None:
        return args, kwargs, None
    return new_args, new_kwargs, caller


def _inward(value: Any, where: str, state: list) -> Any:
    kind = type(value)
    if kind in _PLAIN:
        return value
    if isinstance(value, (tuple, list)):
        items = [_inward(item, f"{where}[{i}]", state) for i, item in enumerate(value)]
        if all(new is old for new, old in zip(items, value, strict=True)):
            return value
        return _rebuilt(value, items)
    if not is_foreign(value):
        return value
    view = state[1].get(id(value))
    if view is not None:
        return view
    library = library_of(value)
    caller = state[0]
    if caller is None:
        caller = state[0] = Caller(library, where)
    elif library != caller:
        raise UsageError(
            f"one call mixes {caller} and {library} tensors: {caller.where} is a {caller} tensor, {where} a "
            f"{library} one",
            hint=f"pass tensors of one library (convert with {caller}.from_dlpack(x) first)",
        )
    try:
        view = from_dlpack(value)
    except BufferError as e:  # the producer's own refusal to share it (numpy: a big-endian or an object array)
        raise DTypeError(
            f"{where} is a {library} {kind.__qualname__} its library will not share through DLPack: {e}",
            hint="make it a native byte order array of a number or bool dtype first (numpy: "
            "x.astype(x.dtype.newbyteorder('=')), or x.astype(np.float32) for an object array)",
        ) from None
    state[1][id(value)] = view
    caller.originals[id(view)] = (view, value)
    return view


def _rebuilt(container: tuple | list, items: list) -> tuple | list:
    kind = type(container)
    if kind is tuple or kind is list:
        return kind(items)
    if hasattr(kind, "_fields"):  # a namedtuple
        return kind(*items)
    return kind(items)


def to_caller(result: Any, kind: Caller | str | None) -> Any:
    """`result` with every nbxcert tensor in it (also inside tuples, lists and dicts) as a tensor of the caller's
    library `kind`, made by that library's `from_dlpack` without a copy; a view `to_nbx` made comes back as the
    caller's own object. With `kind` None, `result` as it is."""
    if kind is None:
        return result
    return _outward(result, kind, getattr(kind, "originals", {}), [])


def _outward(value: Any, kind: str, originals: dict, back: list) -> Any:
    if isinstance(value, Tensor):
        known = originals.get(id(value))
        if known is not None and known[0] is value:
            return known[1]
        if kind == "numpy" and value.dtype.is_raw_bits:  # bfloat16 and the float8 types: numpy has no such dtype
            raise DTypeError(
                f"the result is {value.dtype.name}, which numpy has no dtype for, so it cannot come back as a numpy "
                "array",
                hint="ask for float32 in the same call, or pass nbxcert tensors (nbxcert.kernels.tensor.from_numpy(x, "
                f"'{value.dtype.name}')) to keep a {value.dtype.name} result",
            )
        if not back:
            back.append(_from_dlpack_of(kind))
        return back[0](value)
    if isinstance(value, (tuple, list)):
        items = [_outward(item, kind, originals, back) for item in value]
        if all(new is old for new, old in zip(items, value, strict=True)):
            return value
        return _rebuilt(value, items)
    if isinstance(value, dict):
        return {key: _outward(item, kind, originals, back) for key, item in value.items()}
    return value


def _from_dlpack_of(kind: str):
    """The function of library `kind` that makes its tensor of anything with `__dlpack__`, from loaded modules."""
    module = sys.modules.get(kind)
    convert = None
    if kind == "jax":
        convert = getattr(sys.modules.get("jax.numpy"), "from_dlpack", None)
        convert = convert or getattr(getattr(module, "dlpack", None), "from_dlpack", None)
    elif kind == "numba":  # numba reads the CUDA array interface
        convert = getattr(getattr(module, "cuda", None), "as_cuda_array", None)
    else:
        convert = getattr(module, "from_dlpack", None)
    if convert is None:
        raise UsageError(
            f"module '{kind}' is not loaded or has no from_dlpack: nbxcert cannot hand results back as its tensors",
            hint="pass nbxcert tensors, or tensors of torch, CuPy, JAX or numpy",
        )
    return convert


def serve(call, args: tuple, kwargs: dict, caller: Caller) -> Any:
    """`call(*args, **kwargs)` (nbxcert views of a foreign call's tensors) on the caller's current stream, its result
    handed back as the caller's tensors. torch's current stream is nbxcert's own where none is set
    (`cuda.current_stream`); CuPy's is set for the call; JAX and numpy have none to follow."""
    if caller == "cupy":
        device = next((t.device for t in _views(caller) if t.device.type == "cuda"), None)
        if device is not None:
            from nbxcert.kernels.backends import cuda

            stream = sys.modules["cupy"].cuda.get_current_stream().ptr
            with cuda.using_stream(int(stream), device.index):
                return to_caller(call(*args, **kwargs), caller)
    return to_caller(call(*args, **kwargs), caller)


def _views(caller: Caller) -> list[Tensor]:
    return [view for view, _ in caller.originals.values()]
