"""torch's type promotion over nbxcert's dtypes: which dtype an op computes in and returns, and which results an
in-place or `out=` tensor may take.

Written from torch's documentation (torch.promote_types, torch.result_type, torch.can_cast, the "Type promotion"
section of the tensor attributes page, and the ELEMENTWISE_TYPE_PROMOTION_KIND of torch._prims_common), by dtype name:

- categories, low to high: bool < integral (uint8, int8, int16, int32, int64) < floating (float16, bfloat16,
  float32, float64). Two dtypes promote to the smallest dtype both convert to without losing their category: the
  larger of two signed integers; uint8 with a signed integer: the signed one, at least int16 (uint8 with int8 is
  int16); float16 with bfloat16: float32; bool with anything: the other. The float8 types are refused, as torch does.
- `result_type`: participants are dimensioned tensors, zero-dim tensors and Python scalars (bool -> bool, int ->
  int64, float -> the default float dtype, float32), in that priority. Each group is promoted within itself; a
  lower-priority group changes the result only when its category is higher (a float scalar makes an integer tensor's
  result float32; an int64 zero-dim tensor leaves an int32 tensor's result int32), and then to its own dtype (a
  float16 zero-dim tensor with an int64 tensor gives float16).
- `elementwise_dtypes`: (computation dtype, result dtype) by torch's promotion kinds; the half types compute in
  float32 ("opmath") except under "no_opmath".
- `can_cast`: a result may be cast to an output dtype of the same or a higher category, never lower (float -> int,
  float -> bool, int -> bool are refused; narrowing within a category is allowed).

Errors are `DTypeNotSupported` (an op given a dtype it does not take; a float8 promotion) and `CastRefused` (a result
an out= tensor cannot take), one line each.
"""

from __future__ import annotations

from nbxcert.errors import CastRefused, DTypeNotSupported
from nbxcert.kernels.dtypes import get_dtype

BOOL = ("bool",)
INTEGRAL = ("uint8", "int8", "int16", "int32", "int64")
FLOATING = ("float16", "bfloat16", "float32", "float64")
PROMOTABLE = (*BOOL, *INTEGRAL, *FLOATING)
DEFAULT_FLOAT = "float32"  # torch.get_default_dtype() unless changed; nbxcert has no way to change it
_WIDTH = {"uint8": 8, "int8": 8, "int16": 16, "int32": 32, "int64": 64, "float16": 16, "bfloat16": 16}
_WIDTH.update({"float32": 32, "float64": 64})
KINDS = ("default", "int_to_float", "always_bool", "bool_to_long", "no_opmath")


def category(dtype: str) -> int:
    """0 for bool, 1 for an integral dtype, 2 for a floating one (torch's categories)."""
    name = _name(dtype, "category")
    return 0 if name == "bool" else 1 if name in INTEGRAL else 2


def _name(dtype, op: str) -> str:
    """The canonical name of a dtype (or an alias such as `fp16`), refusing one that type promotion does not take."""
    name = get_dtype(dtype).name  # an unknown name: DTypeError
    if name not in PROMOTABLE:
        raise DTypeNotSupported(
            f"{op}: type promotion of {name} is not supported (torch defines none for float8 types)"
        )
    return name


def promote_types(a: str, b: str) -> str:
    """torch.promote_types(a, b): the smallest dtype both a and b convert to within the higher one's category."""
    a, b = _name(a, "promote_types"), _name(b, "promote_types")
    if a == b:
        return a
    ca, cb = category(a), category(b)
    if ca != cb:
        return a if ca > cb else b  # the higher category's own dtype: int64 with float16 is float16
    if ca == 2:
        if {a, b} == {"float16", "bfloat16"}:
            return "float32"  # neither holds the other: float16 lacks bfloat16's range, bfloat16 float16's precision
        return a if _WIDTH[a] > _WIDTH[b] else b
    if "uint8" in (a, b):
        other = b if a == "uint8" else a
        return "int16" if other == "int8" else other  # a signed type holding 0..255: int16 at least
    return a if _WIDTH[a] > _WIDTH[b] else b


def _participant(x) -> tuple[int, str]:
    """(priority, dtype) of one operand: 2 a dimensioned tensor, 1 a zero-dim tensor, 0 a Python scalar."""
    if isinstance(x, bool):
        return 0, "bool"
    if isinstance(x, int):
        return 0, "int64"
    if isinstance(x, float):
        return 0, DEFAULT_FLOAT
    dtype, ndim = getattr(x, "dtype", None), getattr(x, "ndim", None)
    if dtype is None or ndim is None or isinstance(x, complex):
        raise DTypeNotSupported(
            f"result_type: an operand of type {type(x).__name__} is neither a tensor nor a Python bool, int or float"
        )
    return (2 if ndim > 0 else 1), _name(getattr(dtype, "name", dtype), "result_type")


def _combine(higher: str | None, lower: str | None) -> str | None:
    """The result of a higher-priority group's dtype with a lower one's: the lower group counts only when its
    category is higher, or when the higher group is bool (torch's combine_categories)."""
    if higher is None:
        return lower
    if lower is None or category(higher) == 2:
        return higher
    if category(higher) == 0 or category(lower) == 2:
        return promote_types(higher, lower)
    return higher


def result_type(*operands) -> str:
    """torch.result_type over nbxcert tensors (anything with `.dtype` and `.ndim`) and Python bool/int/float."""
    if not operands:
        raise DTypeNotSupported("result_type: needs at least one operand")
    groups: list[str | None] = [None, None, None]  # Python scalars, zero-dim tensors, dimensioned tensors
    for x in operands:
        priority, dtype = _participant(x)
        held = groups[priority]
        groups[priority] = dtype if held is None else promote_types(held, dtype)
    scalars, zero_dim, dimensioned = groups
    result = _combine(dimensioned, _combine(zero_dim, scalars))
    assert result is not None  # at least one operand was placed in a group
    return result


def computation_dtype(dtype: str) -> str:
    """The dtype torch computes a result of `dtype` in ("opmath"): float32 for the half types, the dtype itself else."""
    name = _name(dtype, "computation_dtype")
    return "float32" if name in ("float16", "bfloat16") else name


def elementwise_dtypes(*operands, kind: str) -> tuple[str, str]:
    """(computation dtype, result dtype) of an element-wise op, by torch's ELEMENTWISE_TYPE_PROMOTION_KIND:

    default: the result type, computed in its opmath type; int_to_float: an integral or bool result type becomes the
    default float dtype (float32); always_bool: the result is bool, computed in the operands' opmath type;
    bool_to_long: a bool result type becomes int64; no_opmath: the result type, computed in itself."""
    if kind not in KINDS:
        raise ValueError(f"elementwise_dtypes: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    rt = result_type(*operands)
    if kind == "no_opmath":
        return rt, rt
    if kind == "int_to_float" and category(rt) < 2:
        rt = DEFAULT_FLOAT
    elif kind == "bool_to_long" and rt == "bool":
        rt = "int64"
    if kind == "always_bool":
        return computation_dtype(rt), "bool"
    return computation_dtype(rt), rt


def can_cast(from_: str, to: str) -> bool:
    """torch.can_cast: False exactly when `to` is of a lower category than `from_` (float -> integral or bool,
    integral -> bool). Any dtype nbxcert has, float8 included (a floating type)."""

    def cat(d) -> int:
        return 2 if d.is_float else 0 if d.name == "bool" else 1

    return cat(get_dtype(to)) >= cat(get_dtype(from_))


def check_cast(op: str, result: str, out: str) -> None:
    """`CastRefused` when an op's result dtype cannot be written into an out=/in-place tensor of dtype `out`."""
    if not can_cast(result, out):
        raise CastRefused(f"{op}: result type {get_dtype(result).name} can't be cast to the output type {out}")


_KIND_WORDS = {"b": "bool", "i": "integral", "f": "floating"}


def check_dtype(op: str, dtype: str, takes: str) -> None:
    """`DTypeNotSupported` when `dtype` is not of a kind the op takes; `takes` holds the kinds' letters: 'b' bool, 'i'
    integral, 'f' floating (bitwise ops take "bi", transcendental functions "f")."""
    name = get_dtype(dtype).name
    letter = "b" if name == "bool" else "i" if name in INTEGRAL else "f"
    if letter not in takes or name not in PROMOTABLE:
        listed = ", ".join(d for d in PROMOTABLE if ("b" if d == "bool" else "i" if d in INTEGRAL else "f") in takes)
        raise DTypeNotSupported(f"{op}: does not take dtype {name}; it takes {listed}")
