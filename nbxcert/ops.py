"""`nbxcert.ops`: nbxcert's kernels under torch's names and signatures, in one namespace (`from nbxcert import ops`).

The pointwise ops below, of torch (`torch.add`, `torch.exp`, `torch.where`, ...) and of `torch.nn.functional`
(`gelu`, `silu`, `leaky_relu`, `logsigmoid` and `log_sigmoid`, `glu`, ...; not every one torch has: `hardtanh`,
`sinh`, `fmax`, ... are not here), take torch's positional and keyword arguments, broadcast their operands, take
Python numbers as operands, promote as torch does (`nbxcert.kernels.promotion`), write `out=` (any strides; one that
overlaps an input in part, or writes one address twice, refused as torch refuses it) and have their in-place `_` form
where torch has one (`add_`, `relu_`, `clamp_`, ...).
Data movement: `empty`, `zeros`, `ones`, `full`, `arange`, `linspace`, `copy_`, `fill_`, `to`. All but `empty` run
one certified kernel, `nbxcert.kernels.pointwise`.

The other families have torch's signatures too, as thin wrappers over their served functions: `matmul`, `mm`, `bmm`,
`addmm`, `baddbmm`, `mv`, `addmv` (torch.*, `out=`, beta/alpha); `softmax`, `log_softmax`, `layer_norm`, `rms_norm`,
`embedding`, `cross_entropy`, `scaled_dot_product_attention`, `conv2d`, `group_norm`, `interpolate`,
`upsample_nearest` (torch.nn.functional); `argmax`, `topk` (torch.*). A layout torch takes is met by a view where one
exists (a reduced dimension moved last, trailing dimensions merged); where only a copy would serve, and for every
argument the kernel cannot honour (an `attn_mask`, `dropout_p` other than 0, `largest=False`, class weights, ...), the
call is refused in one line naming the argument (`ArgumentNotSupported`), never ignored. nbxcert's own ops, which
torch has no name for, keep nbxcert's signatures under their own names: `add_rms_norm`, `add_layer_norm`,
`silu_and_mul`, `gelu_and_mul`, `rope` (`rotary_embedding`), `flash_attention`, `decode_attention`,
`paged_decode_attention`, `fused_moe`, `upsample_nearest2d`, `dequant_matmul`, `dequant_gemv`.

Every op also takes another library's tensors (torch, CuPy, JAX; numpy under the interpreter), as the families'
served entry points do (`nbxcert.kernels.interop`): no copy in, that library's tensors out, an in-place op's and an
`out=`'s as the very object passed; a dtype may be written as that library writes it (`torch.float16`).

An empty tensor (a dimension of 0) launches nothing, as in torch: the op's empty result is made and returned, with no
key looked up (so certified-only serving needs no certificate for it); a product over an inner dimension of 0 is
zeros (beta·input for `addmm`, `baddbmm`, `addmv`), a loss over no sample 0 ("sum") or NaN ("mean").

Importing this module imports no kernel (each is loaded on its first use) and never torch. Errors are one line:
`DTypeError` (a dtype the op does not take), `CastRefused` (a result that `out=` cannot hold),
`ShapeMismatch` (shapes that do not broadcast, an `out=` of the wrong shape), `ArgumentNotSupported` (above),
`LaunchError` (an integer division by zero, a float to integer cast of NaN or out of range).
"""

from __future__ import annotations

import builtins
import functools
import importlib
import inspect
import math
import sys
import weakref
from collections.abc import Sequence
from typing import Any

from nbxcert.errors import ArgumentNotSupported, DTypeError, ShapeMismatch, ViewError

# nbxcert's own ops, which torch has no name for: nbxcert's signatures, under nbxcert's names (loaded on first use).
_NBXCERT_ONLY = {
    # name -> (kernel family module, its function)
    "add_layer_norm": ("rows", "add_layernorm"),
    "add_rms_norm": ("rows", "add_rmsnorm"),
    "silu_and_mul": ("elementwise", "silu_and_mul"),
    "gelu_and_mul": ("elementwise", "gelu_and_mul"),
    "rope": ("elementwise", "rope"),
    "rotary_embedding": ("elementwise", "rope"),
    "flash_attention": ("attention", "flash_attention"),
    "decode_attention": ("attention", "decode_attention"),
    "paged_decode_attention": ("attention", "paged_decode_attention"),
    "fused_moe": ("moe", "fused_moe"),
    "upsample_nearest2d": ("vision", "upsample_nearest2d"),
    "dequant_matmul": ("quant", "dequant_matmul"),
    "dequant_gemv": ("quant", "dequant_gemv"),
}


def __dir__() -> list[str]:
    """The ops (torch's names and nbxcert's own, `__all__`) and the errors they raise, not the module's imports."""
    return sorted(__all__)


def __getattr__(name: str):
    """nbxcert's own ops (`_NBXCERT_ONLY`), loaded on first use."""
    if name in _NBXCERT_ONLY:
        module, attr = _NBXCERT_ONLY[name]
        fn = getattr(_family(module), attr)
        globals()[name] = fn
        return fn
    raise AttributeError(f"module 'nbxcert.ops' has no attribute '{name}'")


def _family(module: str):
    """The kernel family module `module`, one of `nbxcert.kernels.spec.FAMILY_MODULES` (the names `_NBXCERT_ONLY` and
    the wrappers give are constants; anything else is refused before an import)."""
    from nbxcert.kernels.spec import FAMILY_MODULES

    if module not in FAMILY_MODULES:
        raise ValueError(f"nbxcert.ops: '{module}' is not a kernel family ({', '.join(FAMILY_MODULES)})")
    return importlib.import_module(f"nbxcert.kernels.{module}")


def _pw():
    return importlib.import_module("nbxcert.kernels.pointwise")


def _tensor_type():
    return importlib.import_module("nbxcert.kernels.tensor").Tensor


def _is_number(v: Any) -> bool:
    return isinstance(v, (bool, int, float)) and not isinstance(v, type)


def _python_number(v: Any) -> Any:
    """A numpy scalar (`a.max()`, `np.float32(2)`) as the Python number it holds, as torch takes it; else `v`."""
    np = sys.modules.get("numpy")  # a numpy scalar exists only where numpy was imported
    if np is not None and isinstance(v, np.generic):
        return v.item()
    return v


def _scalar(op: str, name: str, value):
    """A Python number, or a 0-dim tensor's value as one (torch takes either for a fill value); anything else refused
    in one line naming the argument."""
    Tensor = _tensor_type()
    if isinstance(value, Tensor):
        if value.ndim != 0:
            raise DTypeError(f"{op}: {name} must be a number or a 0-dim tensor, got a tensor of shape {value.shape}")
        promotion = importlib.import_module("nbxcert.kernels.promotion")
        kind = promotion.category(value.dtype.name)
        held = value.float64().item() if kind == 2 else value.numpy().item()
        return bool(held) if kind == 0 else int(held) if kind == 1 else float(held)
    value = _python_number(value)
    if not _is_number(value):
        raise DTypeError(f"{op}: {name} must be a number, got {type(value).__name__}")
    return value


def _fits(op: str, value, dtype: str) -> None:
    """torch's check of a value written into `dtype` (c10's `overflows`): an integer dtype's range (an unsigned one's
    negatives down to -max, which wrap), a float dtype's largest finite value (infinities and NaN pass); refused in
    one line naming the value and the dtype."""
    if isinstance(value, bool) or dtype == "bool":
        return
    dtypes = importlib.import_module("nbxcert.kernels.dtypes")
    d = dtypes.get_dtype(dtype)
    if d.is_float:
        bad = math.isfinite(value) and builtins.abs(value) > dtypes.finfo(d)["max"]
    else:
        import numpy as np

        info = np.iinfo(np.dtype(d.storage))
        lo = -info.max if info.min == 0 else info.min  # an unsigned type takes negatives down to -max (they wrap)
        bad = not math.isfinite(value) or not lo <= math.trunc(value) <= info.max
    if bad:
        raise DTypeError(f"{op}: value {value!r} cannot be converted to {dtype} without overflow")


def _address_span(t) -> tuple[int, int]:
    lo, hi = t.span()
    base = t.untyped_storage().data_ptr()
    return base + lo, base + hi


def _no_overlap(op: str, out, inputs) -> None:
    """torch's checks before writing `out`: no two of its elements at one address (a stride of 0 over a dimension
    longer than 1: the last write would win), and no input that partly overlaps it by address (one that is `out`
    itself, the same view, is an in-place op and fine; two foreign views of one array are two storages over one
    memory); refused in one line."""
    Tensor = _tensor_type()
    _writable(op, out)
    if any(st == 0 and n > 1 for n, st in zip(out.shape, out.strides, strict=False)):
        raise ViewError(
            f"{op}: more than one element of the written-to tensor refers to a single memory location (an expanded "
            "view): write into a tensor of its own (.clone() it first)"
        )
    if out.numel == 0:
        return
    lo, hi = _address_span(out)
    for t in inputs:
        if t is out or not isinstance(t, Tensor) or t.device != out.device or t.numel == 0:
            continue
        same = t.data_ptr() == out.data_ptr() and t.shape == out.shape and t.strides == out.strides
        if same and t.dtype is out.dtype:
            continue
        a, b = _address_span(t)
        if a < hi and lo < b:
            raise ViewError(
                f"{op}: some elements of an input and of the written-to tensor refer to a single memory location "
                "(views that partly overlap): write into a tensor of its own (.clone() the input first)"
            )


def _torch_name(value) -> str:
    """A torch constant (`torch.float16`, `torch.preserve_format`), a numpy or JAX dtype, or a string, by the name
    nbxcert gives it: read from the object, its library never imported."""
    return str(getattr(value, "__name__", None) or value).removeprefix("torch.")


def _get_dtype(dtype):
    """A dtype by nbxcert's name or alias, or as torch, numpy or JAX write one (`torch.float16`, `np.float16`,
    `np.dtype("float16")`)."""
    dtypes = importlib.import_module("nbxcert.kernels.dtypes")
    if isinstance(dtype, (str, dtypes.DType)):
        return dtypes.get_dtype(dtype)
    return dtypes.get_dtype(_torch_name(dtype))


def _apply(name: str, operands: list, params: dict | None = None, out=None, promote_params: tuple = ()) -> Any:
    """Run pointwise op `name` on `operands` (tensors or Python numbers) with `params`, into `out` (allocated when
    None): promotion, dtype and shape checks, then the served launch."""
    pw = _pw()
    Tensor = _tensor_type()
    op = pw.OPS[name]
    params = dict(params or {})
    operands = [_python_number(v) for v in operands]
    for v in operands:
        if not (isinstance(v, Tensor) or _is_number(v)):
            raise DTypeError(f"{op.name}: an operand of type {type(v).__name__} is neither a Tensor nor a number")
    tensors = [t for t in operands if isinstance(t, Tensor)]
    if not tensors and out is None:
        raise DTypeError(f"{op.name}: at least one operand must be a Tensor")
    shape = pw.broadcast_shapes(*(t.shape for t in tensors)) if tensors else tuple(out.shape)
    device = tensors[0].device if tensors else out.device
    promotion = pw.promotion()
    fixed = op.operand_dtypes
    participants = [v for i, v in enumerate(operands) if not (i < len(fixed) and fixed[i])]
    participants += [params[p] for p in promote_params if params.get(p) is not None]
    for i, v in enumerate(operands):
        if i < len(fixed) and fixed[i] and isinstance(v, Tensor) and v.dtype.name != fixed[i]:
            raise DTypeError(f"{op.name}: operand {i} must be {fixed[i]}, got {v.dtype.name}")
    _, result = promotion.elementwise_dtypes(*participants, kind=op.kind)
    common = promotion.result_type(*participants) if op.kind == "always_bool" else result
    if op.kind == "int_to_float" and common not in pw.FLOATS:
        common = "float32"
    pw.check_dtype(op, common)
    if out is None:
        out = _result(shape, tensors, result, device)
    else:
        if not isinstance(out, Tensor):
            raise DTypeError(f"{op.name}: out must be a Tensor, got {type(out).__name__}")
        if tuple(out.shape) != tuple(shape):
            raise ShapeMismatch(f"{op.name}: out has shape {tuple(out.shape)}, the result's is {tuple(shape)}")
        promotion.check_cast(op.name, result, out.dtype.name)
        _no_overlap(op.name, out, tensors)
    via, compute, kparams, p_float = pw.plan_for(op, operands, common, out, params)
    padded = list(operands) + [None] * (3 - len(operands))
    return _launch(pw, name, *padded, out, via, compute, kparams, p_float)


def _launch(pw, name: str, x, y, z, out, via, compute, kparams, p_float):
    """The served pointwise launch writing `out`, after every check; an empty `out` (a dimension of 0) has nothing to
    compute, so nothing is launched (no key is looked up or swept: torch runs no kernel either) and it comes back as
    it is."""
    if out.numel == 0:
        return out
    return pw.pointwise_call(name, x, y, z, out, via, compute, kparams, p_float)


def _inplace(name: str, self, operands: list, params: dict | None = None, promote_params: tuple = ()):
    """The in-place form: the result written into `self` (its shape must be the broadcast shape)."""
    return _apply(name, operands, params, out=self, promote_params=promote_params)


# ======================================================================================================================
# unary math
# ======================================================================================================================
def _unary(name: str, doc: str):
    def fn(input, *, out=None):
        return _apply(name, [input], out=out)

    def fn_(input):
        return _inplace(name, input, [input])

    fn.__name__, fn.__qualname__, fn.__doc__ = name, name, doc
    fn_.__name__, fn_.__qualname__, fn_.__doc__ = name + "_", name + "_", f"In-place {name}."
    return fn, fn_


abs, abs_ = _unary("abs", "|input|, element-wise (torch.abs; abs(INT_MIN) wraps to INT_MIN).")
absolute = abs
neg, neg_ = _unary("neg", "-input (torch.neg).")
negative = neg
exp, exp_ = _unary("exp", "e^input (torch.exp).")
exp2, exp2_ = _unary("exp2", "2^input (torch.exp2).")
expm1, expm1_ = _unary("expm1", "e^input - 1 (torch.expm1).")
log, log_ = _unary("log", "natural logarithm (torch.log).")
log2, log2_ = _unary("log2", "base-2 logarithm (torch.log2).")
log1p, log1p_ = _unary("log1p", "log(1 + input) (torch.log1p).")
sqrt, sqrt_ = _unary("sqrt", "square root (torch.sqrt).")
rsqrt, rsqrt_ = _unary("rsqrt", "1 / sqrt(input) (torch.rsqrt).")
reciprocal, reciprocal_ = _unary("reciprocal", "1 / input (torch.reciprocal).")
sin, sin_ = _unary("sin", "sine (torch.sin).")
cos, cos_ = _unary("cos", "cosine (torch.cos).")
tan, tan_ = _unary("tan", "tangent (torch.tan).")
tanh, tanh_ = _unary("tanh", "hyperbolic tangent (torch.tanh).")
erf, erf_ = _unary("erf", "error function (torch.erf).")
sign, sign_ = _unary("sign", "-1, 0 or 1 by the sign of input (torch.sign).")
floor, floor_ = _unary("floor", "floor (torch.floor).")
ceil, ceil_ = _unary("ceil", "ceiling (torch.ceil).")
trunc, trunc_ = _unary("trunc", "rounded toward zero (torch.trunc).")
fix = trunc
sigmoid, sigmoid_ = _unary("sigmoid", "1 / (1 + e^-input) (torch.sigmoid).")
logical_not, _ = _unary("logical_not", "input == 0 (torch.logical_not).")
bitwise_not, bitwise_not_ = _unary("bitwise_not", "~input (torch.bitwise_not; logical not of a bool).")
isnan, _ = _unary("isnan", "input is NaN (torch.isnan).")
isinf, _ = _unary("isinf", "input is +-inf (torch.isinf).")
isfinite, _ = _unary("isfinite", "input is finite (torch.isfinite).")


def round(input, *, decimals: int = 0, out=None):  # noqa: A001 - torch's name
    """Rounded half to even (torch.round); decimals other than 0 are refused."""
    if decimals != 0:
        raise DTypeError(f"round: decimals={decimals} is not supported (only 0)")
    return _apply("round", [input], out=out)


def round_(input, *, decimals: int = 0):
    return round(input, decimals=decimals, out=input)


# ======================================================================================================================
# binary arithmetic
# ======================================================================================================================
def _alpha_check(op: str, input, other, alpha) -> None:
    """torch's alpha_check: a floating alpha only for a floating result, a bool alpha only for a bool one (an integer
    add with alpha=1.5 would run with 1)."""
    if type(alpha) is int:  # the default (1) and any integer: nothing to check, no promotion worked out twice
        return
    if not _is_number(alpha):
        raise DTypeError(f"{op}: alpha must be a number, got {type(alpha).__name__}")
    promotion = importlib.import_module("nbxcert.kernels.promotion")
    kind = promotion.category(promotion.result_type(input, other))
    if isinstance(alpha, float) and kind < 2:
        raise DTypeError(f"{op}: for integral input tensors, argument alpha must not be a floating point number")
    if isinstance(alpha, bool) and kind != 0:
        raise DTypeError(f"{op}: boolean alpha only supported for Boolean results")


def add(input, other, *, alpha=1, out=None):
    """input + alpha * other (torch.add)."""
    _alpha_check("add", input, other, alpha)
    return _apply("add", [input, other], {"alpha": alpha}, out=out)


def add_(input, other, *, alpha=1):
    return add(input, other, alpha=alpha, out=input)


def sub(input, other, *, alpha=1, out=None):
    """input - alpha * other (torch.sub)."""
    _alpha_check("sub", input, other, alpha)
    return _apply("sub", [input, other], {"alpha": alpha}, out=out)


def sub_(input, other, *, alpha=1):
    return sub(input, other, alpha=alpha, out=input)


subtract = sub


def rsub(input, other, *, alpha=1, out=None):
    """other - alpha * input (torch.rsub)."""
    _alpha_check("rsub", input, other, alpha)
    return _apply("sub", [other, input], {"alpha": alpha}, out=out)


def mul(input, other, *, out=None):
    """input * other (torch.mul)."""
    return _apply("mul", [input, other], out=out)


def mul_(input, other):
    return mul(input, other, out=input)


multiply = mul

_ROUNDING = {None: "div", "trunc": "div_trunc", "floor": "div_floor"}


def div(input, other, *, rounding_mode=None, out=None):
    """input / other (torch.div): true division, or rounded "trunc" / "floor"."""
    if rounding_mode not in _ROUNDING:
        raise DTypeError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
    return _apply(_ROUNDING[rounding_mode], [input, other], out=out)


def div_(input, other, *, rounding_mode=None):
    return div(input, other, rounding_mode=rounding_mode, out=input)


divide = true_divide = div


def floor_divide(input, other, *, out=None):
    """floor(input / other) (torch.floor_divide)."""
    return _apply("div_floor", [input, other], out=out)


def _binary(name: str, doc: str, inplace: bool = True):
    def fn(input, other, *, out=None):
        return _apply(name, [input, other], out=out)

    def fn_(input, other):
        return _apply(name, [input, other], out=input)

    fn.__name__, fn.__qualname__, fn.__doc__ = name, name, doc
    fn_.__name__, fn_.__qualname__, fn_.__doc__ = name + "_", name + "_", f"In-place {name}."
    return fn, (fn_ if inplace else None)


remainder, remainder_ = _binary("remainder", "input mod other with the divisor's sign (torch.remainder).")
fmod, fmod_ = _binary("fmod", "C's fmod: the remainder with the dividend's sign (torch.fmod).")
maximum, _ = _binary("maximum", "element-wise maximum, NaN propagating (torch.maximum).", False)
minimum, _ = _binary("minimum", "element-wise minimum, NaN propagating (torch.minimum).", False)
atan2, atan2_ = _binary("atan2", "atan2(input, other) (torch.atan2).")
arctan2 = atan2
hypot, hypot_ = _binary("hypot", "sqrt(input^2 + other^2) (torch.hypot).")
eq, eq_ = _binary("eq", "input == other (torch.eq).")
ne, ne_ = _binary("ne", "input != other (torch.ne).")
lt, lt_ = _binary("lt", "input < other (torch.lt).")
le, le_ = _binary("le", "input <= other (torch.le).")
gt, gt_ = _binary("gt", "input > other (torch.gt).")
ge, ge_ = _binary("ge", "input >= other (torch.ge).")
logical_and, logical_and_ = _binary("logical_and", "input and other (torch.logical_and).")
logical_or, logical_or_ = _binary("logical_or", "input or other (torch.logical_or).")
logical_xor, logical_xor_ = _binary("logical_xor", "input xor other (torch.logical_xor).")
bitwise_and, bitwise_and_ = _binary("bitwise_and", "input & other (torch.bitwise_and).")
bitwise_or, bitwise_or_ = _binary("bitwise_or", "input | other (torch.bitwise_or).")
bitwise_xor, bitwise_xor_ = _binary("bitwise_xor", "input ^ other (torch.bitwise_xor).")
bitwise_left_shift, bitwise_left_shift_ = _binary("bitwise_left_shift", "input << other (torch.bitwise_left_shift).")
bitwise_right_shift, bitwise_right_shift_ = _binary(
    "bitwise_right_shift", "input >> other (torch.bitwise_right_shift)."
)
greater, less, greater_equal, less_equal, not_equal = gt, lt, ge, le, ne


def pow(input, exponent, *, out=None):  # noqa: A001 - torch's name
    """input ** exponent (torch.pow). An integer tensor to a negative Python-int power is refused as torch refuses it
    (a negative exponent inside an integer tensor gives torch's 1, +-1 or 0)."""
    # bool counts as an integer here, as in torch
    integer_base = isinstance(input, _tensor_type()) and _pw().promotion().category(input.dtype.name) <= 1
    if integer_base and isinstance(exponent, int) and not isinstance(exponent, bool) and exponent < 0:
        raise DTypeError(f"pow: integers to negative integer powers are not allowed (exponent {exponent})")
    return _apply("pow", [input, exponent], out=out)


def pow_(input, exponent):
    return pow(input, exponent, out=input)


def lerp(input, end, weight, *, out=None):
    """input + weight (end - input) (torch.lerp); weight a tensor or a number."""
    return _apply("lerp", [input, end, weight], out=out)


def lerp_(input, end, weight):
    return lerp(input, end, weight, out=input)


def addcdiv(input, tensor1, tensor2, *, value=1, out=None):
    """input + value * tensor1 / tensor2 (torch.addcdiv)."""
    return _apply("addcdiv", [input, tensor1, tensor2], {"value": value}, out=out)


def addcdiv_(input, tensor1, tensor2, *, value=1):
    return addcdiv(input, tensor1, tensor2, value=value, out=input)


def addcmul(input, tensor1, tensor2, *, value=1, out=None):
    """input + value * tensor1 * tensor2 (torch.addcmul)."""
    return _apply("addcmul", [input, tensor1, tensor2], {"value": value}, out=out)


def addcmul_(input, tensor1, tensor2, *, value=1):
    return addcmul(input, tensor1, tensor2, value=value, out=input)


# ======================================================================================================================
# selection
# ======================================================================================================================
def nan_to_num(input, nan=0.0, posinf=None, neginf=None, *, out=None):
    """NaN, +inf and -inf replaced (torch.nan_to_num; the infinities default to the dtype's extremes)."""
    return _apply("nan_to_num", [input], {"nan": nan, "posinf": posinf, "neginf": neginf}, out=out)


def nan_to_num_(input, nan=0.0, posinf=None, neginf=None):
    return nan_to_num(input, nan, posinf, neginf, out=input)


def clamp(input, min=None, max=None, *, out=None):  # noqa: A002 - torch's names
    """min(max(input, min), max) (torch.clamp); at least one bound; NaN stays NaN."""
    if min is None and max is None:
        raise DTypeError("clamp: at least one of min and max must be given")
    Tensor = _tensor_type()
    if isinstance(min, Tensor) or isinstance(max, Tensor):  # tensor bounds: broadcast and promoted, as maximum/minimum
        if max is None:
            return _apply("maximum", [input, min], out=out)
        if min is None:
            return _apply("minimum", [input, max], out=out)
        return _apply("minimum", [_apply("maximum", [input, min]), max], out=out)
    if max is None:
        return _apply("clamp_min", [input], {"min": min}, out=out, promote_params=("min",))
    if min is None:
        return _apply("clamp_max", [input], {"max": max}, out=out, promote_params=("max",))
    return _apply("clamp", [input], {"min": min, "max": max}, out=out, promote_params=("min", "max"))


def clamp_(input, min=None, max=None):  # noqa: A002
    return clamp(input, min, max, out=input)


clip, clip_ = clamp, clamp_


def clamp_min(input, min, *, out=None):  # noqa: A002
    return clamp(input, min=min, out=out)


def clamp_max(input, max, *, out=None):  # noqa: A002
    return clamp(input, max=max, out=out)


def clamp_min_(input, min):  # noqa: A002
    return clamp(input, min=min, out=input)


def clamp_max_(input, max):  # noqa: A002
    return clamp(input, max=max, out=input)


def where(condition, input, other, *, out=None):
    """input where condition holds, other elsewhere (torch.where; condition bool)."""
    return _apply("where", [condition, input, other], out=out)


def masked_fill(input, mask, value, *, out=None):
    """input with value (a number or a 0-dim tensor) where mask (bool) holds (torch.Tensor.masked_fill)."""
    value = _scalar("masked_fill", "value", value)
    _fits("masked_fill", value, (out if out is not None else input).dtype.name)
    return _apply("masked_fill", [input, mask], {"value": value}, out=out)


def masked_fill_(input, mask, value):
    return masked_fill(input, mask, value, out=input)


# ======================================================================================================================
# activations (torch.nn.functional's names)
# ======================================================================================================================
def relu(input, inplace: bool = False):
    """max(input, 0), NaN kept (F.relu)."""
    return _apply("relu", [input], out=input if inplace else None)


def relu_(input):
    return relu(input, inplace=True)


def gelu(input, approximate: str = "none"):
    """GELU (F.gelu): the erf form, or approximate="tanh"."""
    if approximate not in ("none", "tanh"):
        raise DTypeError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _apply("gelu" if approximate == "none" else "gelu_tanh", [input])


def _act(name: str, doc: str, params: tuple = ()):
    def fn(input, *args, inplace: bool = False, **kwargs):
        values = dict(params)
        if len(args) > len(params) + 1:
            raise DTypeError(f"{name}() takes {len(params) + 2} positional arguments at most, {len(args) + 1} given")
        if len(args) == len(params) + 1:  # torch's signature: (input, *params, inplace=False)
            *args, inplace = args
        for (key, _), v in zip(params, args, strict=False):
            values[key] = v
        for key, v in kwargs.items():
            if key not in values:
                raise DTypeError(f"{name}() got an unexpected keyword argument '{key}'")
            values[key] = v
        return _apply(name, [input], values, out=input if inplace else None)

    def fn_(input, *args, **kwargs):
        return fn(input, *args, inplace=True, **kwargs)

    fn.__name__, fn.__qualname__, fn.__doc__ = name, name, doc
    fn_.__name__, fn_.__qualname__ = name + "_", name + "_"
    return fn, fn_


silu, silu_ = _act("silu", "input * sigmoid(input) (F.silu).")
mish, mish_ = _act("mish", "input * tanh(softplus(input)) (F.mish).")
elu, elu_ = _act("elu", "input, or alpha (e^input - 1) below 0 (F.elu).", (("alpha", 1.0),))
celu, celu_ = _act("celu", "max(0, x) + min(0, alpha (e^(x/alpha) - 1)) (F.celu).", (("alpha", 1.0),))
selu, selu_ = _act("selu", "scale (x, or alpha (e^x - 1) below 0) (F.selu).")
leaky_relu, leaky_relu_ = _act(
    "leaky_relu", "x, or negative_slope x below 0 (F.leaky_relu).", (("negative_slope", 0.01),)
)
hardsigmoid, hardsigmoid_ = _act("hardsigmoid", "clamp(x + 3, 0, 6) / 6 (F.hardsigmoid).")
hardswish, hardswish_ = _act("hardswish", "x clamp(x + 3, 0, 6) / 6 (F.hardswish).")
threshold, threshold_ = _act(
    "threshold", "value where x <= threshold, else x (F.threshold).", (("threshold", 0.0), ("value", 0.0))
)


def softplus(input, beta: float = 1.0, threshold: float = 20.0):
    """log(1 + e^(beta x)) / beta, x where beta x > threshold (F.softplus)."""
    return _apply("softplus", [input], {"beta": beta, "threshold": threshold})


def logsigmoid(input):
    """log(sigmoid(x)) (F.logsigmoid)."""
    return _apply("log_sigmoid", [input])


log_sigmoid = logsigmoid


def glu(input, dim: int = -1):
    """a * sigmoid(b), a and b the halves of input along dim (F.glu)."""
    d = dim % input.ndim if input.ndim else 0
    size = input.shape[d]
    if size % 2:
        raise ShapeMismatch(f"glu: halving dimension {dim} must be even, got size {size}")
    half = size // 2
    lead = (slice(None),) * d
    return _apply("glu", [input[lead + (slice(0, half),)], input[lead + (slice(half, size),)]])


# ======================================================================================================================
# data movement
# ======================================================================================================================
def _size(size: tuple) -> tuple[int, ...]:
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    return tuple(int(s) for s in size)


def _fill_new(op_name: str, shape, value, dtype, device, out):
    """A new tensor of `shape` (or `out`, which must have that shape, and `dtype` where one is given) filled with
    `value`; `dtype` None: float32."""
    pw = _pw()
    if out is None:
        out = pw.empty(shape, _get_dtype(dtype or DEFAULT_DTYPE).name, device)
    else:
        if tuple(out.shape) != tuple(shape):
            raise ShapeMismatch(f"{op_name}: out has shape {tuple(out.shape)}, the size asked is {tuple(shape)}")
        if dtype is not None and _get_dtype(dtype).name != out.dtype.name:
            raise DTypeError(f"{op_name}: dtype {_get_dtype(dtype).name} does not match out's, {out.dtype.name}")
    return _fill(out, value, op_name)


def _fill(t, value, op_name: str = "fill_"):
    pw = _pw()
    op = pw.OPS["fill"]
    value = _scalar(op_name, "value", value)
    _fits(op_name, value, t.dtype.name)
    _writable(op_name, t)
    d = t.dtype.name
    pw.check_dtype(op, d)
    via, compute, kparams, p_float = pw.plan_for(op, [], d, t, {"value": value})
    return _launch(pw, "fill", None, None, None, t, via, compute, kparams, p_float)


DEFAULT_DTYPE = "float32"  # torch.get_default_dtype() (nbxcert has no way to change it)


def empty(*size, dtype=None, device="cpu", out=None):
    """A tensor of the size, its elements not set (torch.empty: no kernel runs); `out=` is returned as it is."""
    if out is not None:
        if tuple(out.shape) != _size(size):
            raise ShapeMismatch(f"empty: out has shape {tuple(out.shape)}, the size asked is {_size(size)}")
        return out
    pw = _pw()
    return pw.empty(_size(size), _get_dtype(dtype or DEFAULT_DTYPE).name, device)


def empty_like(input, *, dtype=None):
    """A tensor of input's shape and device (and dtype, unless given), its elements not set (torch.empty_like)."""
    return empty(input.shape, dtype=dtype or input.dtype.name, device=input.device)


def zeros(*size, dtype=None, device="cpu", out=None):
    """A tensor of zeros (torch.zeros)."""
    return _fill_new("zeros", _size(size), 0, dtype, device, out)


def ones(*size, dtype=None, device="cpu", out=None):
    """A tensor of ones (torch.ones)."""
    return _fill_new("ones", _size(size), 1, dtype, device, out)


def full(size, fill_value, *, dtype=None, device="cpu", out=None):
    """A tensor of fill_value (torch.full: the dtype defaults to the value's: bool, int64 or float32)."""
    fill_value = _scalar("full", "fill_value", fill_value)
    if dtype is None and out is None:
        dtype = "bool" if isinstance(fill_value, bool) else "int64" if isinstance(fill_value, int) else DEFAULT_DTYPE
    return _fill_new("full", _size((size,)), fill_value, dtype, device, out)


def zeros_like(input, *, dtype=None):
    return zeros(input.shape, dtype=dtype or input.dtype.name, device=input.device)


def ones_like(input, *, dtype=None):
    return ones(input.shape, dtype=dtype or input.dtype.name, device=input.device)


def full_like(input, fill_value, *, dtype=None):
    return full(input.shape, fill_value, dtype=dtype or input.dtype.name, device=input.device)


def fill_(input, value):
    """input with every element value (torch.Tensor.fill_)."""
    return _fill(input, value)


def zero_(input):
    return _fill(input, 0)


def arange(start=0, end=None, step=1, *, dtype=None, device="cpu", out=None):
    """start, start + step, ... below end (torch.arange; one argument: 0 .. start; `end=` alone: 0 .. end)."""
    if end is None:
        start, end = 0, start
    if step == 0:
        raise DTypeError("arange: step must be nonzero")
    if (end - start) * step < 0:
        raise DTypeError(f"arange: upper bound and larger bound inconsistent with step sign ({start}, {end}, {step})")
    n = math.ceil((end - start) / step)
    if dtype is None:
        dtype = "int64" if all(isinstance(v, int) for v in (start, end, step)) else "float32"
    pw = _pw()
    if out is None:
        out = pw.empty((n,), _get_dtype(dtype).name, device)
    elif tuple(out.shape) != (n,):
        raise ShapeMismatch(f"arange: out has shape {tuple(out.shape)}, the result's is ({n},)")
    op = pw.OPS["arange"]
    pw.check_dtype(op, out.dtype.name)
    via, compute, kparams, p_float = pw.plan_for(op, [], out.dtype.name, out, {"start": start, "step": step})
    return _launch(pw, "arange", None, None, None, out, via, compute, kparams, p_float)


def linspace(start, end, steps, *, dtype=None, device="cpu", out=None):
    """steps values from start to end (torch.linspace); an integer dtype's values the float64 ones truncated toward
    zero, as torch's."""
    pw = _pw()
    if out is None:
        out = pw.empty((int(steps),), _get_dtype(dtype or DEFAULT_DTYPE).name, device)
    elif tuple(out.shape) != (int(steps),):
        raise ShapeMismatch(f"linspace: out has shape {tuple(out.shape)}, the result's is ({int(steps)},)")
    promotion = importlib.import_module("nbxcert.kernels.promotion")
    if out.dtype.name in promotion.INTEGRAL:
        return _cast_into(linspace(start, end, steps, dtype="float64", device=out.device), out)
    op = pw.OPS["linspace"]
    pw.check_dtype(op, out.dtype.name)
    via, compute, kparams, p_float = pw.plan_for(op, [], out.dtype.name, out, {"start": start, "end": end})
    return _launch(pw, "linspace", None, None, None, out, via, compute, kparams, p_float)


def _cast_into(src, out):
    pw = _pw()
    name = "copy" if src.dtype is out.dtype else "cast"
    op = pw.OPS[name]
    pw.check_dtype(op, src.dtype.name)
    pw.check_dtype(op, out.dtype.name)
    if tuple(pw.broadcast_shapes(src.shape, out.shape)) != tuple(out.shape):
        raise ShapeMismatch(f"copy_: source shape {tuple(src.shape)} does not broadcast to {tuple(out.shape)}")
    _no_overlap("copy_", out, [src])
    via, compute, kparams, p_float = pw.plan_for(op, [src], src.dtype.name, out, {})
    return _launch(pw, name, src, None, None, out, via, compute, kparams, p_float)


def copy_(input, src, non_blocking: bool = False):
    """src's values written into input, any strides, broadcast, cast to input's dtype (torch.Tensor.copy_; every
    launch is asynchronous on its stream, so `non_blocking` changes nothing)."""
    return _cast_into(src, input)


MEMORY_FORMATS = ("preserve_format", "contiguous_format")


def _memory_format(op: str, memory_format) -> str:
    """torch's memory_format by name (`torch.preserve_format` or the string); the channels-last formats refused."""
    name = _torch_name(memory_format)
    if name not in MEMORY_FORMATS:
        _refuse(op, f"memory_format={memory_format} (nbxcert copies as {' or '.join(MEMORY_FORMATS)})")
    return name


def _stride_order(shape: tuple, strides: Sequence[tuple]) -> list[int]:
    """The dimensions from the innermost out, as torch orders them for a result's layout (TensorIterator's reordering
    of dimensions): an insertion sort where the first operand whose strides in two dimensions are both nonzero and
    differ decides their order, a larger size outermost between equal strides, and a dimension that no operand
    orders (a broadcast, stride 0) left where it stands. `strides`: each operand's, broadcast to `shape`."""
    order = list(range(len(shape)))[::-1]

    def swap(a: int, b: int) -> int:
        for st in strides:
            sa, sb = st[a], st[b]
            if sa == 0 or sb == 0:
                continue
            if sa != sb:
                return 1 if sa > sb else -1
            if shape[a] > shape[b]:
                return 1
        return 0

    for i in range(1, len(order)):
        j = i
        for k in range(i - 1, -1, -1):
            c = swap(order[k], order[j])
            if c > 0:
                order[k], order[j] = order[j], order[k]
                j = k
            elif c < 0:
                break
    return order


def _result(shape: tuple, tensors: list, dtype: str, device):
    """A new result of an element-wise op, laid out as torch lays one out: contiguous where every tensor operand is;
    else dense in the order of dimensions its operands' strides give (`_stride_order`), so the result of operands
    that share a transposed or permuted layout has it too (and the op runs over them in storage order)."""
    pw = _pw()
    if len(shape) < 2 or all(t.is_contiguous() for t in tensors):
        return pw.empty(shape, dtype, device)
    tm = importlib.import_module("nbxcert.kernels.tensor")
    dense, step = [0] * len(shape), 1
    for d in _stride_order(shape, [t.expand(shape).strides for t in tensors]):  # broadcast: stride 0
        dense[d] = step
        step *= max(shape[d], 1)
    kind = _get_dtype(dtype)
    return tm.Tensor(tm.Storage(step * kind.itemsize, device), shape, dense, kind)


def clone(input, *, memory_format="preserve_format"):
    """A copy (torch.clone). memory_format `preserve_format` (torch's default): the copy laid out as input is, in
    dense strides that keep its order of dimensions (a transposed or permuted dense view keeps its very strides, and
    is copied in one pass over storage); `contiguous_format`: a contiguous copy (as `input.contiguous()` makes one)."""
    pw = _pw()
    if _memory_format("clone", memory_format) == "contiguous_format":
        return _cast_into(input, pw.empty(input.shape, input.dtype.name, input.device))
    return _cast_into(input, _result(tuple(input.shape), [input], input.dtype.name, input.device))


def to(input, dtype, non_blocking: bool = False, copy: bool = False):
    """input cast to dtype (torch.Tensor.to(dtype, non_blocking=False, copy=False); `non_blocking` changes nothing,
    every launch being asynchronous on its stream): floats to integers truncate toward zero (NaN,
    infinities and values out of range refused), anything to bool is != 0. input itself where it already has the
    dtype, as torch returns it, unless `copy`."""
    pw = _pw()
    target = _get_dtype(dtype).name
    if target == input.dtype.name and not copy:
        return input
    return _cast_into(input, pw.empty(input.shape, target, input.device))


cast = to


# ======================================================================================================================
# the other families under torch's names and signatures: thin wrappers over their served functions
# ======================================================================================================================
def _refuse(op: str, what: str):
    """A torch argument the kernel cannot honour, refused by name (never ignored)."""
    raise ArgumentNotSupported(f"{op}: {what}")


def _dim_index(op: str, dim: int, ndim: int) -> int:
    if not -max(ndim, 1) <= dim < max(ndim, 1):
        raise ViewError(f"{op}: dim {dim} is out of range for a {ndim}-d tensor")
    return dim % max(ndim, 1)


def _to_last(op: str, t, dim: int, role: str = "input") -> tuple[Any, tuple[int, ...] | None]:
    """`t` with dimension `dim` moved last, as a view whose rows the kernels (which reduce the last dimension, its
    elements contiguous) can read, and the permutation that undoes the move (None when `dim` is already last).
    Refused when only a copy would give such rows."""
    d = _dim_index(op, dim, t.ndim)
    if t.ndim == 0:
        return t, None
    order = [i for i in range(t.ndim) if i != d] + [d]
    moved = t if d == t.ndim - 1 else t.permute(order)
    n = moved.shape[-1]
    try:
        rows = moved.view(-1, n)
    except ViewError:
        rows = None
    if rows is None or (n > 1 and rows.stride(1) != 1):
        _refuse(
            op,
            f"dim={dim} of {role} (shape {tuple(t.shape)}, strides {tuple(t.strides)}) is not a view of contiguous "
            "rows; the kernel reduces the last dimension and a copy is not made for you (pass dim=-1, or a tensor "
            "whose reduced dimension has stride 1)",
        )
    if d == t.ndim - 1:
        return t, None
    inverse = [0] * t.ndim
    for i, o in enumerate(order):
        inverse[o] = i
    return moved, tuple(inverse)


def _back(t, inverse):
    return t if inverse is None else t.permute(inverse)


def _view_as(op: str, t, shape, role: str):
    """`t.view(shape)`, refused (not copied) where the strides cannot express it."""
    try:
        return t.view(tuple(shape))
    except ViewError:
        _refuse(
            op,
            f"{role} of shape {tuple(t.shape)} and strides {tuple(t.strides)} is not a view of shape "
            f"{tuple(shape)}; a copy is not made for you (pass a contiguous tensor)",
        )


def _legacy_softmax_dim(ndim: int) -> int:
    """torch's `_get_softmax_dim` for dim=None: 0 for 0-, 1- and 3-d inputs, else 1."""
    return 0 if ndim in (0, 1, 3) else 1


def _empty_input(input, family: str, dtypes: str = "FLOAT_DTYPES") -> bool:
    """Whether `input` is empty (a dimension of 0) and of a dtype its kernel takes (the kernel family's own tuple
    `dtypes`, read only for an empty input): then the op's result is empty too and made with nothing launched (no key
    is looked up or swept), as torch launches nothing. Another dtype goes on to the kernel, which refuses it as it
    refuses it non-empty."""
    return input.numel == 0 and input.dtype.name in getattr(_family(family), dtypes)


def _empty_result(input):
    """An empty result of input's shape, dtype and device (a row op's, a norm's of an empty input)."""
    return _pw().empty(tuple(input.shape), input.dtype.name, input.device)


def _row_op(op: str, fn, input, dim, dtype):
    if dtype is not None:
        input = to(input, dtype)  # torch casts the input to dtype before the op, as this does
    if dim is None:
        dim = _legacy_softmax_dim(input.ndim)
    if _empty_input(input, "rows"):
        _dim_index(op, dim, input.ndim)
        return _empty_result(input)
    moved, inverse = _to_last(op, input, dim)
    return _back(fn(moved), inverse)


def softmax(input, dim=None, _stacklevel=3, dtype=None):
    """F.softmax over dimension `dim` (a view of rows: the last dimension, or one the strides move there); `dtype`
    casts the input first. `_stacklevel` only places torch's warning and changes nothing."""
    return _row_op("softmax", _family("rows").softmax, input, dim, dtype)


def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    """F.log_softmax over dimension `dim`, as `softmax`."""
    return _row_op("log_softmax", _family("sampling").log_softmax, input, dim, dtype)


def _normalized(op: str, input, normalized_shape) -> tuple[tuple[int, ...], int]:
    ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(int(n) for n in normalized_shape)
    if not ns or tuple(input.shape[input.ndim - len(ns) :]) != ns or len(ns) > input.ndim:
        raise ShapeMismatch(f"{op}: normalized_shape {ns} is not the trailing shape of input {tuple(input.shape)}")
    return ns, math.prod(ns)


def _norm_rows(op: str, input, ns, n):
    """input as [..., n]: the normalized dimensions merged into one (a view, or refused)."""
    if len(ns) == 1:
        return input
    return _view_as(op, input, tuple(input.shape[: input.ndim - len(ns)]) + (n,), "input")


def _affine_shapes(op: str, ns, **given) -> None:
    """Each of weight and bias that is given has the shape normalized_shape."""
    for role, t in given.items():
        if t is not None and tuple(t.shape) != ns:
            raise ShapeMismatch(f"{op}: {role} has shape {tuple(t.shape)}, normalized_shape is {ns}")


def _affine(op: str, t, ns, n, role: str, like, fill: float):
    """weight or bias as [n]; None is torch's "no affine": ones (weight) or zeros (bias) of input's dtype."""
    if t is None:
        return full((n,), fill, dtype=like.dtype.name, device=like.device)
    _affine_shapes(op, ns, **{role: t})
    return t if len(ns) == 1 else _view_as(op, t, (n,), role)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """F.layer_norm over the trailing `normalized_shape` (merged into one dimension by a view); weight and bias None
    are ones and zeros."""
    ns, n = _normalized("layer_norm", input, normalized_shape)
    if _empty_input(input, "rows"):
        _affine_shapes("layer_norm", ns, weight=weight, bias=bias)
        return _empty_result(input)
    w = _affine("layer_norm", weight, ns, n, "weight", input, 1.0)
    b = _affine("layer_norm", bias, ns, n, "bias", input, 0.0)
    y = _family("rows").layernorm(_norm_rows("layer_norm", input, ns, n), w, b, float(eps))
    return y.view(tuple(input.shape))


def rms_norm(input, normalized_shape, weight=None, eps=None):
    """F.rms_norm: input / sqrt(mean(input²) + eps) * weight over the trailing `normalized_shape`. eps None is
    torch's default, torch.finfo(input.dtype).eps; weight None is ones."""
    ns, n = _normalized("rms_norm", input, normalized_shape)
    if eps is None:
        eps = importlib.import_module("nbxcert.kernels.dtypes").finfo(input.dtype)["eps"]
    if _empty_input(input, "rows"):
        _affine_shapes("rms_norm", ns, weight=weight)
        return _empty_result(input)
    w = _affine("rms_norm", weight, ns, n, "weight", input, 1.0)
    y = _family("rows").rmsnorm(_norm_rows("rms_norm", input, ns, n), w, float(eps))
    return y.view(tuple(input.shape))


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False):
    """F.embedding: weight's rows at the integer ids `input`. `padding_idx`, `scale_grad_by_freq` and `sparse` shape
    only gradients, which nbxcert does not compute, so the forward result is torch's; `padding_idx` is range-checked
    as torch does. `max_norm` (which renormalises weight's rows in place) is refused."""
    if max_norm is not None:
        _refuse("embedding", f"max_norm={max_norm} (renormalising weight's rows in place) is not supported")
    if padding_idx is not None and not -weight.shape[0] <= padding_idx < weight.shape[0]:
        raise ShapeMismatch(f"embedding: padding_idx {padding_idx} is outside the {weight.shape[0]} rows of weight")
    if input.numel == 0 and weight.ndim == 2 and input.dtype.name in ("int32", "int64"):
        return _pw().empty(tuple(input.shape) + (weight.shape[1],), weight.dtype.name, weight.device)
    return _family("elementwise").embedding(weight, input)


def argmax(input, dim=None, keepdim=False):
    """torch.argmax: the index (int64) of the first maximum along `dim` (None: of the flattened input; NaN ranks
    above every number)."""
    if _empty_input(input, "sampling"):
        d = None if dim is None else _dim_index("argmax", dim, input.ndim)
        if d is None or input.shape[d] == 0:
            raise ShapeMismatch(
                f"argmax: input of shape {tuple(input.shape)} has no element to choose along "
                f"{'its flattened elements' if d is None else f'dimension {dim}'} (torch refuses it too)"
            )
        shape = tuple(n if i != d else 1 for i, n in enumerate(input.shape) if keepdim or i != d)
        return _pw().empty(shape, "int64", input.device)
    sampling = _family("sampling")
    if dim is None:
        flat, _ = _to_last("argmax", _view_as("argmax", input, (input.numel,), "input"), 0)
        idx = sampling.argmax(flat).view(())
        return idx.view((1,) * input.ndim) if keepdim else idx
    moved, _ = _to_last("argmax", input, dim)
    idx = sampling.argmax(moved)
    return idx.unsqueeze(_dim_index("argmax", dim, input.ndim)) if keepdim and input.ndim else idx


class _TopK(tuple):
    """(values, indices), by position or by name, as torch.return_types.topk."""

    __slots__ = ()

    def __new__(cls, values, indices):
        return super().__new__(cls, (values, indices))

    @property
    def values(self):
        return self[0]

    @property
    def indices(self):
        return self[1]


def topk(input, k, dim=-1, largest=True, sorted=True, *, out=None):  # noqa: A002 - torch's names
    """torch.topk: the k largest values along `dim` and their int64 indices, in rank order (sorted=False is met: a
    sorted result is one order it allows). largest=False is refused."""
    if not largest:
        _refuse("topk", "largest=False (the k smallest) is not supported; the kernel selects the largest")
    if out is None and (k == 0 or input.numel == 0) and input.dtype.name in _family("sampling").FLOAT_DTYPES:
        d = _dim_index("topk", dim, input.ndim)
        if not 0 <= k <= (input.shape[d] if input.ndim else 1):
            raise ShapeMismatch(f"topk: k={k} is out of range for dimension {dim} of shape {tuple(input.shape)}")
        shape = tuple(k if i == d else n for i, n in enumerate(input.shape))
        if math.prod(shape) == 0:  # nothing to select: empty values and indices, nothing launched
            pw = _pw()
            return _TopK(pw.empty(shape, input.dtype.name, input.device), pw.empty(shape, "int64", input.device))
    moved, inverse = _to_last("topk", input, dim)
    values = indices = None
    if out is not None:
        values, indices = out
        if inverse is not None:
            order = [inverse.index(i) for i in range(len(inverse))]
            values, indices = values.permute(order), indices.permute(order)
    v, i = _family("sampling").topk(moved, k, values, indices)
    return _TopK(_back(v, inverse), _back(i, inverse))


_REDUCTIONS = ("none", "mean", "sum")


def cross_entropy(
    input,
    target,
    weight=None,
    size_average=None,
    ignore_index=-100,
    reduce=None,  # noqa: A002 - torch's name
    reduction="mean",
    label_smoothing=0.0,
):
    """F.cross_entropy with class-index targets: input (C,), (N, C) or (N, C, d1, ...) (classes in dimension 1, a
    view of rows), target int64; a target equal to ignore_index adds 0 and is not counted by "mean". The per-row loss
    is nbxcert's kernel, in input's dtype; "sum" and "mean" add the losses in float32 (row_reduce) and round once
    into input's dtype. A target outside [0, C) gives NaN (torch raises). Refused: `weight`, `label_smoothing`,
    class probabilities as target, and the deprecated `size_average` / `reduce`."""
    op = "cross_entropy"
    if weight is not None:
        _refuse(op, "weight (per-class weights) is not supported")
    if size_average is not None or reduce is not None:
        _refuse(op, "size_average and reduce are deprecated in torch and not supported; use reduction=")
    if label_smoothing != 0.0:
        _refuse(op, f"label_smoothing={label_smoothing} is not supported (only 0.0)")
    if reduction not in _REDUCTIONS:
        _refuse(op, f"reduction={reduction!r} is not one of 'none', 'mean', 'sum'")
    if target.dtype.is_float:
        _refuse(op, "a float target (class probabilities) is not supported; give int64 class indices")
    if (
        _empty_input(input, "sampling")
        and input.ndim > 1
        and input.shape[0] == 0
        and tuple(target.shape) == (0, *input.shape[2:])
    ):
        # no sample: torch's loss of none, an empty "none", a "sum" of 0 and a "mean" of 0/0 (NaN)
        if reduction == "none":
            return _pw().empty(tuple(target.shape), input.dtype.name, input.device)
        return full((), 0.0 if reduction == "sum" else math.nan, dtype=input.dtype.name, device=input.device)
    logits, _ = (input.unsqueeze(0), None) if input.ndim == 1 else _to_last(op, input, 1)
    loss = _family("sampling").cross_entropy(logits, target, int(ignore_index))
    if input.ndim == 1:
        loss = loss.view(())
    if reduction == "none":
        return loss
    rows = _family("rows")
    total = rows.row_reduce(to(loss.view(1, loss.numel), "float32"), "sum")
    result = _pw().empty((1,), input.dtype.name, input.device)
    if reduction == "sum":
        copy_(result, total)
    else:
        counted = to(ne(target.view(1, target.numel), ignore_index), "float32")
        div(total, rows.row_reduce(counted, "sum"), out=result)
    return result.view(())


def scaled_dot_product_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """F.scaled_dot_product_attention over nbxcert's flash attention: query (N, ..., Hq, L, E), key and value
    (N, ..., H, S, E) (3-d: no head dimension; more than 4: the leading dimensions merged by a view). Refused:
    attn_mask, dropout_p other than 0, and is_causal with L != S (torch's mask is then top-left aligned, the
    kernel's bottom-right). Hq != H needs enable_gqa=True, as in torch."""
    op = "scaled_dot_product_attention"
    if attn_mask is not None:
        _refuse(op, "attn_mask is not supported (only is_causal); the kernel takes no mask tensor")
    if dropout_p != 0.0:
        _refuse(op, f"dropout_p={dropout_p} is not supported (only 0.0)")
    if not (query.ndim == key.ndim == value.ndim and query.ndim >= 3):
        raise ShapeMismatch(
            f"{op}: query, key and value need one rank of at least 3, got {query.ndim}, {key.ndim}, {value.ndim}"
        )

    def as4(t, role):
        if t.ndim == 3:
            return t.unsqueeze(1)
        return t if t.ndim == 4 else _view_as(op, t, (-1, *t.shape[-3:]), role)

    q, k, v = as4(query, "query"), as4(key, "key"), as4(value, "value")
    if q.shape[1] != k.shape[1] and not enable_gqa:
        raise ShapeMismatch(f"{op}: query has {q.shape[1]} heads, key {k.shape[1]}; pass enable_gqa=True")
    if is_causal and q.shape[2] != k.shape[2]:
        _refuse(
            op,
            f"is_causal with L={q.shape[2]} != S={k.shape[2]} (torch aligns the mask top-left, the kernel "
            "bottom-right)",
        )
    if (
        q.numel == 0
        and (q.dtype.name,) in _family("attention").DTYPES
        and q.dtype is k.dtype is v.dtype
        and q.shape[0] == k.shape[0] == v.shape[0]
        and q.shape[-1] == k.shape[-1]
    ):
        # no query (a batch, a head count or a length of 0): an empty result, nothing launched
        return _pw().empty(tuple(query.shape[:-1]) + (value.shape[-1],), query.dtype.name, query.device)
    y = _family("attention").flash_attention(q, k, v, causal=bool(is_causal), scale=scale)
    return y.view(tuple(query.shape[:-1]) + (y.shape[-1],))


def _one_int(op: str, name: str, value) -> int:
    """A torch int-or-pair argument as the one int the kernel takes for both spatial dimensions."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2 or value[0] != value[1]:
            _refuse(op, f"{name}={tuple(value)}: the kernel takes one value for both spatial dimensions")
        value = value[0]
    return value


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """F.conv2d (float16 / bfloat16) of input (N, C, H, W) or (C, H, W); stride, padding and dilation an int or an
    equal pair; padding "valid" or "same" (symmetric only)."""
    op = "conv2d"
    stride, dilation = _one_int(op, "stride", stride), _one_int(op, "dilation", dilation)
    if isinstance(padding, str):
        if padding == "valid":
            padding = 0
        elif padding == "same":
            if stride != 1:
                _refuse(op, f"padding='same' with stride={stride} (torch allows it only with stride 1)")
            pads = {dilation * (r - 1) for r in weight.shape[2:]}
            if len(pads) != 1 or next(iter(pads)) % 2:
                _refuse(
                    op,
                    f"padding='same' for kernel {tuple(weight.shape[2:])} with dilation {dilation} is not "
                    "symmetric; the kernel pads both sides alike",
                )
            padding = next(iter(pads)) // 2
        else:
            _refuse(op, f"padding={padding!r} is not 'valid', 'same', an int or a pair")
    padding = _one_int(op, "padding", padding)
    x = input.unsqueeze(0) if input.ndim == 3 else input
    if (
        _empty_input(x, "vision", "CONV_DTYPES")
        and x.ndim == 4
        and x.shape[0] == 0
        and weight.ndim == 4
        and weight.dtype is x.dtype
        and (bias is None or bias.dtype is x.dtype)
        and x.shape[1] == weight.shape[1] * groups
    ):
        # no image: the empty result of torch's shape, nothing launched
        spatial = zip(x.shape[2:], weight.shape[2:], strict=True)
        oh, ow = ((n + 2 * padding - dilation * (r - 1) - 1) // stride + 1 for n, r in spatial)
        if oh > 0 and ow > 0:
            return _pw().empty((0, weight.shape[0], oh, ow), input.dtype.name, input.device)
    y = _family("vision").conv2d(x, weight, bias, stride, padding, dilation, groups)
    return y[0] if input.ndim == 3 else y


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    """F.group_norm of input (N, C, *) (4-d as it lies, nchw or nhwc; other ranks viewed as (N, C, L, 1)); weight and
    bias None are ones and zeros."""
    op = "group_norm"
    if input.ndim < 2:
        raise ShapeMismatch(f"{op}: input needs (N, C, *), got shape {tuple(input.shape)}")
    c = input.shape[1]
    if _empty_input(input, "vision", "NORM_DTYPES") and num_groups > 0 and c % num_groups == 0:
        _affine_shapes(op, (c,), weight=weight, bias=bias)
        return _empty_result(input)
    x = input if input.ndim == 4 else _view_as(op, input, (input.shape[0], c, -1, 1), "input")
    w = full((c,), 1.0, dtype=input.dtype.name, device=input.device) if weight is None else weight
    b = full((c,), 0.0, dtype=input.dtype.name, device=input.device) if bias is None else bias
    y = _family("vision").group_norm(x, num_groups, w, b, float(eps))
    return y if input.ndim == 4 else y.view(tuple(input.shape))


def _integer_factor(op: str, value, name: str) -> int:
    if float(value) != int(value) or int(value) < 1:
        _refuse(op, f"{name} gives the factor {value}; the kernel upsamples by positive integer factors")
    return int(value)


def interpolate(
    input,
    size=None,
    scale_factor=None,
    mode="nearest",
    align_corners=None,
    recompute_scale_factor=None,
    antialias=False,
):
    """F.interpolate for mode="nearest" of a 4-d input by integer factors (given as `scale_factor`, or as a `size`
    that is a multiple of the input's); every other mode, align_corners and antialias are refused. With integer
    factors recompute_scale_factor changes nothing."""
    op = "interpolate"
    if mode != "nearest":
        _refuse(op, f"mode={mode!r} is not supported (only 'nearest')")
    if align_corners is not None:
        _refuse(op, "align_corners is not supported with mode='nearest' (torch refuses it too)")
    if antialias:
        _refuse(op, "antialias=True is not supported")
    if input.ndim != 4:
        _refuse(op, f"a {input.ndim}-d input is not supported (only 4-d (N, C, H, W))")
    if (size is None) == (scale_factor is None):
        _refuse(op, "exactly one of size and scale_factor must be given")
    h, w = input.shape[2:]
    if size is not None:
        oh, ow = (size, size) if isinstance(size, int) else tuple(size)
        factors = (_integer_factor(op, oh / h, f"size={oh}"), _integer_factor(op, ow / w, f"size={ow}"))
    else:
        sh, sw = tuple(scale_factor) if isinstance(scale_factor, (tuple, list)) else (scale_factor, scale_factor)
        factors = (_integer_factor(op, sh, "scale_factor"), _integer_factor(op, sw, "scale_factor"))
    if input.numel == 0:
        n, c = input.shape[:2]
        return _pw().empty((n, c, h * factors[0], w * factors[1]), input.dtype.name, input.device)
    return _family("vision").upsample_nearest2d(input, factors)


def upsample_nearest(input, size=None, scale_factor=None):
    """F.upsample_nearest (torch's deprecated name for interpolate(..., mode="nearest"))."""
    return interpolate(input, size, scale_factor, mode="nearest")


# --- matrix products --------------------------------------------------------------------------------------------------
def _empty_product(a, b, out, add=None, beta=1):
    """The result of a product with a dimension of 0 (a @ b, or beta·add + alpha·(a @ b)), with no product launched
    (no key is looked up or swept), as torch launches none: empty where the result is; where only the inner dimension
    is 0, zeros, or beta·add (a copy, then a scale). None where the product has work to do, or where its operands do
    not make one (the family refuses those, naming them). a is (..., n, m), b (..., m, p), one batch dimension at
    most, a 1-d b a vector (mv)."""
    vector = b.ndim == 1
    if 0 not in tuple(a.shape) + tuple(b.shape) or a.ndim not in (2, 3) or b.ndim != (1 if vector else a.ndim):
        return None
    if a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[0 if vector else -2]:
        return None
    dtypes = {t.dtype.name for t in (a, b, out, add) if t is not None}
    if len(dtypes) != 1 or (a.dtype.name,) * 2 not in _family("matmul").MATMUL.dtypes:
        return None
    shape = tuple(a.shape[:-1]) + (() if vector else (b.shape[-1],))
    if out is not None and tuple(out.shape) != shape:
        return None
    if add is not None and tuple(_pw().broadcast_shapes(add.shape, shape)) != shape:
        return None
    result = out if out is not None else _pw().empty(shape, a.dtype.name, a.device)
    if result.numel == 0:
        return result
    if add is None:
        return _fill(result, 0)
    _cast_into(add, result)
    return result if beta == 1 else mul_(result, beta)


def mm(input, mat2, *, out=None):
    """torch.mm: (n, m) @ (m, p), one dtype (float16, bfloat16, float32)."""
    done = _empty_product(input, mat2, out)
    return done if done is not None else _family("matmul").matmul(input, mat2, out=out)


def bmm(input, mat2, *, out=None):
    """torch.bmm: (b, n, m) @ (b, m, p)."""
    done = _empty_product(input, mat2, out)
    return done if done is not None else _family("matmul").bmm(input, mat2, out=out)


def _beta_zero(op: str, alpha):
    """torch ignores input when beta is 0 (its NaN and inf do not propagate), which the fused kernel, computing
    beta·input, does not: beta=0 runs the plain product, which has no alpha."""
    if alpha != 1:
        _refuse(op, f"beta=0 with alpha={alpha} is not supported (beta=0 runs the plain product, alpha 1)")


def addmm(input, mat1, mat2, *, beta=1, alpha=1, out=None):
    """torch.addmm: beta·input + alpha·(mat1 @ mat2), input broadcastable to (n, p)."""
    if beta == 0:
        _beta_zero("addmm", alpha)
        return mm(mat1, mat2, out=out)
    done = _empty_product(mat1, mat2, out, input, beta)
    if done is not None:
        return done
    return _family("matmul").addmm(input, mat1, mat2, beta=float(beta), alpha=float(alpha), out=out)


def baddbmm(input, batch1, batch2, *, beta=1, alpha=1, out=None):
    """torch.baddbmm: beta·input + alpha·(batch1 @ batch2), input broadcastable to (b, n, p)."""
    if beta == 0:
        _beta_zero("baddbmm", alpha)
        return bmm(batch1, batch2, out=out)
    done = _empty_product(batch1, batch2, out, input, beta)
    if done is not None:
        return done
    return _family("matmul").baddbmm(input, batch1, batch2, beta=float(beta), alpha=float(alpha), out=out)


def _check_mv(op: str, mat, vec):
    if mat.ndim != 2 or vec.ndim != 1:
        raise ShapeMismatch(f"{op}: needs a 2-d matrix and a 1-d vector, got {tuple(mat.shape)} and {tuple(vec.shape)}")


def mv(input, vec, *, out=None):
    """torch.mv: (n, m) @ (m,), through the decode kernel (gemv of vec against input's transpose, a view)."""
    _check_mv("mv", input, vec)
    done = _empty_product(input, vec, out)
    return done if done is not None else _family("matmul").gemv(vec, input.T, out=out)


def addmv(input, mat, vec, *, beta=1, alpha=1, out=None):
    """torch.addmv: beta·input + alpha·(mat @ vec)."""
    _check_mv("addmv", mat, vec)
    if beta == 0:
        _beta_zero("addmv", alpha)
        return mv(mat, vec, out=out)
    done = _empty_product(mat, vec, out, input, beta)
    if done is not None:
        return done
    return _family("matmul").addmv(input, vec, mat.T, beta=float(beta), alpha=float(alpha), out=out)


def matmul(input, other, *, out=None):
    """torch.matmul: 1-d by 1-d a dot product, 2-d by 2-d mm, a 1-d operand a row (left) or column (right) removed
    from the result, more dimensions a batched product whose batch dimensions broadcast. Batch dimensions are merged
    by views (refused where only a copy would merge them)."""
    op = "matmul"
    a, b = input, other
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeMismatch(f"{op}: both arguments need at least 1 dimension, got {a.ndim} and {b.ndim}")
    a2 = a.unsqueeze(0) if a.ndim == 1 else a
    b2 = b.unsqueeze(1) if b.ndim == 1 else b
    batch = tuple(_pw().broadcast_shapes(a2.shape[:-2], b2.shape[:-2]))
    m, n = a2.shape[-2], b2.shape[-1]
    shape = batch + ((m,) if a.ndim > 1 else ()) + ((n,) if b.ndim > 1 else ())
    if out is not None and tuple(out.shape) != shape:
        raise ShapeMismatch(f"{op}: out has shape {tuple(out.shape)}, the product's is {shape}")
    if not batch:
        flat_out = None if out is None else _view_as(op, out, (m, n), "out")
        y = mm(a2, b2, out=flat_out)
    elif b.ndim <= 2:
        # (..., m, k) @ (k, n): the batch folded into the rows, one mm
        rows = _view_as(op, a2, (-1, a2.shape[-1]), "input")
        flat_out = None if out is None else _view_as(op, out, (rows.shape[0], n), "out")
        y = mm(rows, b2, out=flat_out)
    else:
        nb = math.prod(batch)
        ab = _view_as(op, a2.expand(batch + a2.shape[-2:]), (nb, *a2.shape[-2:]), "input")
        bb = _view_as(op, b2.expand(batch + b2.shape[-2:]), (nb, *b2.shape[-2:]), "other")
        flat_out = None if out is None else _view_as(op, out, (nb, m, n), "out")
        y = bmm(ab, bb, out=flat_out)
    return out if out is not None else y.view(shape)


# What `from nbxcert.ops import *` and `dir(nbxcert.ops)` give: every op defined here, nbxcert's own ops (loaded on
# first use) and the errors the ops raise; the module's imports and helpers are not ops.
__all__ = sorted(
    {
        n
        for n, v in list(globals().items())
        if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == __name__
    }
    | set(_NBXCERT_ONLY)
    | {"ArgumentNotSupported", "DTypeError", "ShapeMismatch", "ViewError"}
)


# Another library's tensors (torch, CuPy, JAX; numpy under the interpreter) are taken by every op above as the kernel
# families' served entry points take them (`nbxcert.kernels.interop`): the op runs on nbxcert views of them (DLPack or
# the CUDA array interface, no copy) and its result comes back as that library's tensors (an in-place op's or an
# `out=`'s as the very object passed). A call of nbxcert tensors and Python values alone goes straight to the op.
_NATIVE: set = set()  # the argument types a call goes straight with: filled at the first call (no import before)
# the storages of views over memory their library does not let be written (a read-only numpy array, a memory-mapped
# file opened "r", a JAX array, which is immutable): `_writable` refuses a write into one
_READ_ONLY: weakref.WeakSet = weakref.WeakSet()


def _foreign_read_only(library: str, original) -> bool:
    """Whether the caller's object is memory its library does not let be written: a numpy array whose `writeable`
    flag is off, any JAX array (immutable)."""
    if library == "jax":
        return True
    flags = getattr(original, "flags", None)
    return library == "numpy" and flags is not None and not flags.writeable


def _writable(op: str, out) -> None:
    """`out` is not memory its library does not let be written (`_READ_ONLY`): written, a read-only numpy array
    changed behind its flag, a read-only memory-mapped file crashed the process, a JAX array lost its immutability."""
    if _READ_ONLY and out.untyped_storage() in _READ_ONLY:
        raise ViewError(
            f"{op}: the tensor written to is memory its library does not let be written (a read-only numpy array, a "
            "memory-mapped file opened read-only, a JAX array)",
            hint="write into a writable copy, or pass out= a tensor of your own",
        )


def _taking_foreign(fn):
    @functools.wraps(fn)
    def op(*args, **kwargs):
        native = _NATIVE
        if not native:
            native.update({_tensor_type(), int, float, bool, str, type(None)})
        for v in args:
            if type(v) not in native:
                break
        else:
            for v in kwargs.values():
                if type(v) not in native:
                    break
            else:
                return fn(*args, **kwargs)
        interop = importlib.import_module("nbxcert.kernels.interop")
        views, view_kwargs, caller = interop.to_nbx(args, kwargs)
        if caller is None:
            return fn(*args, **kwargs)
        for view, original in caller.originals.values():
            if _foreign_read_only(caller, original):
                _READ_ONLY.add(view.untyped_storage())
        return interop.serve(fn, views, view_kwargs, caller)

    return op


_wrapped: dict[int, Any] = {}  # one wrapper per function, so an alias stays the same object (`cast is to`)
for _name in __all__:
    _fn = globals().get(_name)
    if inspect.isfunction(_fn) and _fn.__module__ == __name__:
        if id(_fn) not in _wrapped:
            _wrapped[id(_fn)] = _taking_foreign(_fn)
        globals()[_name] = _wrapped[id(_fn)]
del _wrapped, _name, _fn
